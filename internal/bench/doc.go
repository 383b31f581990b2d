// SPDX-License-Identifier: Apache-2.0

// Package bench is pxn-bench's scenario engine: it runs the PXN engine end
// to end with every rank and every remote target a separate process, writes
// each scenario's traffic pattern through the engine and then through the
// second hop alone, checks every byte at the targets, and turns what the
// processes report into rows. The same scenarios run on host memory and on
// CUDA GPUs; the soak kills, restarts and stalls ranks while it checks
// every round.
//
// The ranks, targets and helpers are started by re-executing the running
// binary with cmd/pxn-bench's hidden commands (rank, target, soak-rank,
// cuda-firsthop), whose flags fill RankOptions, TargetOptions,
// SoakRankOptions and FirsthopOptions; the argument lists are built here.
// docs/benchmarks.md explains the scenarios.
package bench

// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// mpsDefaultPipes is where CUDA clients look for an MPS control daemon
// when CUDA_MPS_PIPE_DIRECTORY is not set.
const mpsDefaultPipes = "/tmp/nvidia-mps"

// mpsState is whether the CUDA processes a run starts share their GPUs
// through an MPS control daemon (their kernels and copies then run side by
// side) or time-slice between their contexts.
type mpsState struct {
	on bool
	// why says how it was told: the pipe folder and what it holds.
	why string
}

func (m mpsState) String() string {
	if m.on {
		return "on"
	}
	return "off"
}

// detectMPS tells whether a CUDA client started with env would reach an MPS
// control daemon: the pipe folder (CUDA_MPS_PIPE_DIRECTORY, else the
// driver's default) holds the daemon's control pipe or socket. A client that
// finds none runs without MPS.
func detectMPS(getenv func(string) string) mpsState {
	dir := getenv("CUDA_MPS_PIPE_DIRECTORY")
	from := "CUDA_MPS_PIPE_DIRECTORY=" + dir
	if dir == "" {
		dir, from = mpsDefaultPipes, "the default pipe folder "+mpsDefaultPipes
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return mpsState{why: fmt.Sprintf("%s: %v", from, err)}
	}
	var pipes []string
	for _, e := range ents {
		if e.Type()&(fs.ModeNamedPipe|fs.ModeSocket) == 0 {
			continue
		}
		if e.Name() == "control" {
			return mpsState{on: true, why: fmt.Sprintf("%s holds the daemon's control pipe", from)}
		}
		pipes = append(pipes, e.Name())
	}
	if len(pipes) > 0 {
		sort.Strings(pipes)
		return mpsState{on: true, why: fmt.Sprintf("%s holds the daemon's pipes (%s)", from, filepath.Join(dir, pipes[0]))}
	}
	return mpsState{why: from + " holds no daemon pipe"}
}

// sharedGPU reports a GPU that several of s's ranks use, and how many.
func sharedGPU(s scenario) (gpu, ranks int) {
	per := map[int]int{}
	for k := 0; k < s.ranks; k++ {
		per[s.gpu(k)]++
	}
	gpu = -1
	for g, n := range per {
		if n > ranks || n == ranks && g < gpu {
			gpu, ranks = g, n
		}
	}
	return gpu, ranks
}

// mpsWarning is the one line a CUDA run prints when some scenario puts
// several ranks on one GPU without MPS, or "" when none does.
func mpsWarning(m mpsState, runs []scenario) string {
	if m.on {
		return ""
	}
	for _, s := range runs {
		if g, n := sharedGPU(s); n > 1 {
			return fmt.Sprintf("pxn-bench: warning: %d ranks share GPU %d without MPS (%s): their contexts time-slice the GPU, so the figures measure context switches more than the engine; run under an MPS control daemon (hack/gpu-kit.sh starts one)", n, g, m.why)
		}
	}
	return ""
}

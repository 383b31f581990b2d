// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/engineconfig"
	"github.com/pxn-project/pxn/pkg/engineopen"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/sim/fabric"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/inspect"
)

// A probe rank is one of the two ranks of a group that spans two pods: it
// serves a target for its own rail (a TCP target server on the pod's IP,
// which it announces in the group folder), writes its pattern to the other
// rank's target through the engine (so the other rank relays it), stays up
// until the other rank is done too, then checks what the other rank wrote
// into its target and what the registry holds, and closes once the other
// has checked as well. It prints one JSON line, its rankReport, last.
const (
	rankWrites     = 8
	rankWriteBytes = 1 << 20
	rankTargetLen  = 16 << 20
	// rankWait bounds each wait on the other pod.
	rankWait = 3 * time.Minute
)

type rankReport struct {
	Index int `json:"index"`
	// PidNS is the pod's PID namespace.
	PidNS          string `json:"pid_ns"`
	PXN            bool   `json:"pxn"`
	RelayedPieces  uint64 `json:"relayed_pieces"`
	FallbackPieces uint64 `json:"fallback_pieces"`
	FailedPieces   uint64 `json:"failed_pieces"`
	ArenasByFD     uint64 `json:"arenas_by_fd"`
	ArenasByHandle uint64 `json:"arenas_by_handle"`
	// Verified is how many bytes of the other rank's writes this rank's
	// target holds, each checked.
	Verified uint64 `json:"verified"`
	// Ranks are the control files in the registry before closing, and how
	// this rank's namespace judges each.
	Ranks map[string]string `json:"ranks"`
	Err   string            `json:"err,omitempty"`
}

func targetBase(index int) uint64 { return 0x7e0000000000 + uint64(index)<<32 }

// pattern fills b with the bytes of rank index's source at offsets off...
func pattern(b []byte, index int, off uint64) {
	for i := range b {
		p := off + uint64(i)
		z := (uint64(index)+1)*0x9e3779b97f4a7c15 ^ (p/8)*0xbf58476d1ce4e5b9
		z ^= z >> 29
		b[i] = byte(z >> (8 * (p % 8)))
	}
}

func runRank(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("rank: want INDEX HCA PEER_HCA, got %q", args)
	}
	index, err := strconv.Atoi(args[0])
	if err != nil || (index != 0 && index != 1) {
		return fmt.Errorf("rank: index %q: want 0 or 1", args[0])
	}
	rep := rankReport{Index: index}
	if err := rank(&rep, index, args[1], args[2]); err != nil {
		rep.Err = err.Error()
	}
	b, _ := json.Marshal(rep)
	fmt.Println(string(b))
	if rep.Err != "" {
		return errors.New(rep.Err)
	}
	return nil
}

func rank(rep *rankReport, index int, hca, peerHCA string) error {
	ctx := context.Background()
	ns, err := staging.SelfPidNS()
	if err != nil {
		return err
	}
	rep.PidNS = ns.String()
	cfg := engineconfig.Load(nil, func(err error) { fmt.Fprintln(os.Stderr, "config:", err) })
	if !cfg.Enable {
		return errors.New(contract.EnvEnable + " is not on: the pod did not get pxn.io/relay")
	}
	shared := cfg.RegistryRoot
	peer := 1 - index
	rail, peerRail := staging.CanonicalRail(cfg.RailMap, hca), staging.CanonicalRail(cfg.RailMap, peerHCA)
	if rail == "" || peerRail == "" || rail == peerRail {
		return fmt.Errorf("HCAs %s and %s map to rails %q and %q: want two rails", hca, peerHCA, rail, peerRail)
	}

	tgt, err := mapMem(rankTargetLen)
	if err != nil {
		return err
	}
	srv := fabric.NewTargetServer(fabric.TargetServerOptions{})
	defer srv.Close()
	if err := srv.Register(targetBase(index), tgt); err != nil {
		return err
	}
	ip := os.Getenv("POD_IP")
	if ip == "" {
		return errors.New("POD_IP is not set")
	}
	addr, err := srv.Listen(ctx, net.JoinHostPort(ip, "0"))
	if err != nil {
		return err
	}
	mine := fabric.StaticTarget{Session: "e2e/" + rail, Addr: addr.String(), HCAs: []string{hca},
		Ranges: []fabric.StaticRange{{Addr: targetBase(index), Len: rankTargetLen}}}
	if err := publishJSON(filepath.Join(shared, fmt.Sprintf("e2e-target-%d.json", index)), mine); err != nil {
		return err
	}
	var theirs fabric.StaticTarget
	if err := waitJSON(filepath.Join(shared, fmt.Sprintf("e2e-target-%d.json", peer)), &theirs); err != nil {
		return err
	}
	dir, err := fabric.NewStaticDirectory([]fabric.StaticTarget{mine, theirs})
	if err != nil {
		return err
	}

	src, err := mapMem(rankWrites * rankWriteBytes)
	if err != nil {
		return err
	}
	pattern(src, index, 0)
	srcBase := uintptr(unsafe.Pointer(&src[0]))
	cop := cpucopy.NewHostCopier(cpucopy.HostCopierOptions{})
	if err := cop.RegisterDevice(srcBase, uint64(len(src))); err != nil {
		return err
	}
	hop := fabric.NewTCPHop(fabric.TCPHopOptions{Targets: dir.Addresses(), QueueDepth: 256})
	defer hop.Close()
	eng, err := engineopen.OpenFromEnv(ctx, nil, engineopen.HostDeps{Hop: hop, Directory: dir, Copier: cop, LocalHCA: hca})
	if err != nil {
		return err
	}
	defer eng.Close(ctx)
	if rep.PXN = eng.PXNActive(); !rep.PXN {
		return errors.New("PXN is off in the engine")
	}
	if err := until("a relay on "+peerRail, func() bool { return eng.HasRelay(peerRail) }); err != nil {
		return err
	}
	reqs := make([]relay.Request, rankWrites)
	for i := range reqs {
		off := uint64(i) * rankWriteBytes
		reqs[i] = relay.Request{Op: relay.Write, Src: srcBase + uintptr(off), Len: rankWriteBytes, Target: theirs.Session, Dst: targetBase(peer) + off}
	}
	b, err := eng.Submit(reqs)
	if err != nil {
		return err
	}
	if err := until("the writes to complete", func() bool {
		for i := 0; i < b.Len(); i++ {
			if st, _ := b.Status(i); st.State == relay.Pending {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	for i := 0; i < b.Len(); i++ {
		if st, _ := b.Status(i); st.State != relay.Completed {
			return fmt.Errorf("write %d: %v %v", i, st.State, st.Err)
		}
	}
	c := eng.Counters()
	rep.RelayedPieces, rep.FallbackPieces, rep.FailedPieces = c.RelayedPieces, c.FallbackPieces, c.FailedPieces
	rep.ArenasByFD, rep.ArenasByHandle = c.ArenasByFD, c.ArenasByHandle

	// The other rank may still relay through this one: stay until it is
	// done as well.
	if err := publishJSON(filepath.Join(shared, fmt.Sprintf("e2e-done-%d.json", index)), rep); err != nil {
		return err
	}
	var done rankReport
	if err := waitJSON(filepath.Join(shared, fmt.Sprintf("e2e-done-%d.json", peer)), &done); err != nil {
		return err
	}
	want := make([]byte, rankWrites*rankWriteBytes)
	pattern(want, peer, 0)
	for i := range want {
		if tgt[i] != want[i] {
			return fmt.Errorf("target byte %d is %#x, want %#x from rank %d", i, tgt[i], want[i], peer)
		}
	}
	rep.Verified = uint64(len(want))
	groups, err := inspect.Root(shared, cfg.HeartbeatTimeout)
	if err != nil {
		return err
	}
	rep.Ranks = map[string]string{}
	for _, g := range groups {
		for _, r := range g.Ranks {
			rep.Ranks[r.File] = r.Liveness + " " + r.Health
		}
	}
	// Neither closes before the other has looked at the registry.
	if err := publishJSON(filepath.Join(shared, fmt.Sprintf("e2e-checked-%d.json", index)), rep); err != nil {
		return err
	}
	return waitJSON(filepath.Join(shared, fmt.Sprintf("e2e-checked-%d.json", peer)), &done)
}

func mapMem(n int) ([]byte, error) {
	return unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
}

// publishJSON writes v to path whole: a reader sees all of it or nothing.
func publishJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func waitJSON(path string, v any) error {
	var b []byte
	err := until(path, func() bool {
		var err error
		b, err = os.ReadFile(path)
		return err == nil
	})
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func until(what string, cond func() bool) error {
	deadline := time.Now().Add(rankWait)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s within %v", what, rankWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

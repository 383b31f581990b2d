// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
	"github.com/pxn-project/pxn/pkg/staging/registry/inspect"
)

func inspectRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "pxn-inspect-test-")
	if err != nil {
		t.Logf("no /dev/shm (%v): using a temporary directory", err)
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func register(t *testing.T, root, rail, hca string) *registry.Rank {
	t.Helper()
	r, err := registry.Register(context.Background(), registry.Options{
		Root: root, Group: "demo", UID: os.Geteuid(), Rail: rail, HCA: hca,
		// These ranks have no pump to beat: keep them fresh on a slow machine.
		HeartbeatTimeout: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(context.Background()) })
	return r
}

// dirState is every name, mode, size and modification time under dir.
func dirState(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		lines = append(lines, fmt.Sprintf("%s %v %d %d", path, fi.Mode(), fi.Size(), fi.ModTime().UnixNano()))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func runInspect(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := execute(context.Background(), append([]string{"inspect"}, args...), &out, &errOut)
	return out.String(), errOut.String(), code
}

func TestInspectShowsRanksLanesAndGarbage(t *testing.T) {
	root := inspectRoot(t)
	relay := register(t, root, "rail0", "mlx5_0")
	sender := register(t, root, "rail1", "mlx5_1")
	peers, err := sender.Peers(context.Background())
	if err != nil || len(peers) != 1 {
		t.Fatalf("Peers = %v, %v", peers, err)
	}
	link, err := sender.Attach(context.Background(), peers[0])
	if err != nil {
		t.Fatal(err)
	}
	// Seqs 1..41 published, 1..40 completed, 1..39 reaped.
	tx, rx := link.Sender(), relay.Inbound(0)
	epoch, _ := rx.Sync()
	rx.Open()
	for seq := uint64(1); seq <= 41; seq++ {
		if got, ok := tx.Ticket(); !ok || got != seq {
			t.Fatalf("ticket %d (%v), want %d", got, ok, seq)
		}
		if err := tx.Commit(seq, "s", []staging.PlanEntry{{Dst: 0x1000, Len: 8}}, 8, nil); err != nil {
			t.Fatal(err)
		}
		staging.RingDoorbell(tx.ReadyWord(seq), seq)
		if err := tx.Publish(seq); err != nil {
			t.Fatal(err)
		}
		if seq > 40 {
			continue
		}
		if err := rx.Complete(epoch, seq, staging.CompletionOK); err != nil {
			t.Fatal(err)
		}
		if seq > 39 {
			continue
		}
		if got, _, ok := tx.Reap(); !ok || got != seq {
			t.Fatalf("reaped %d (%v), want %d", got, ok, seq)
		}
	}
	// The relay copies its lanes' progress into its control file with its
	// heartbeat, at most one every 100 ms.
	for deadline := time.Now().Add(10 * time.Second); !relay.Heartbeat(staging.MonoNanos()); {
		if time.Now().After(deadline) {
			t.Fatal("the relay did not beat within 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	st := staging.RankStats{ForwardedBytes: 3 << 20, ForwardedPieces: 3, DirectBytes: 512, FailedPieces: 2, CreditWaits: 5, OutboundLanes: 1, PumpCPUNanos: 1_500_000}
	st.FallbackBytes[staging.FallbackRelayStale], st.FallbackPieces[staging.FallbackRelayStale] = 64<<10, 1
	st.FallbackBytes[staging.FallbackNoLane], st.FallbackPieces[staging.FallbackNoLane] = 128<<10, 2
	relay.PublishStats(&st, staging.MonoNanos())

	dir := relay.Dir()
	truncated := fmt.Sprintf("rank-%d-%d-00000000000000ff", os.Getpid(), relay.Identity().StartTime)
	for name, b := range map[string][]byte{"junk": []byte("x"), truncated: []byte("0123456789")} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	before := dirState(t, root)
	ns, err := staging.SelfPidNS()
	if err != nil {
		t.Fatal(err)
	}

	out, errOut, code := runInspect(t, "--root", root, "--stale-after", "1m")
	if code != 0 {
		t.Fatalf("inspect exited %d: %s", code, errOut)
	}
	t.Logf("inspect --root %s:\n%s", root, out)
	group := filepath.Base(dir)
	pid := strconv.Itoa(os.Getpid())
	relayID := fmt.Sprintf("%s/%016x", pid, relay.Identity().Epoch)
	senderID := fmt.Sprintf("%s/%016x", pid, sender.Identity().Epoch)
	for _, want := range [][]string{
		{group, relay.Name(), "READY", pid, fmt.Sprintf("%016x", relay.Identity().Epoch), "rail0", "mlx5_0", "host", "lane-descriptor", ns.String(), " pid ", "live"},
		{group, sender.Name(), "READY", pid, "rail1", "mlx5_1", "live"},
		{group, relayID, " 0 ", senderID, fmt.Sprintf("%016x", link.LaneEpoch()), " 42 ", " 41 ", " 40 ", " 39 ", " pid ", "live"},
		{group, relayID, " 6 ", " - ", " - ", " 0 ", " 0 ", " 0 ", " 0 ", "free"},
		{group, senderID, " 0 ", " - ", " - ", " 0 ", " 0 ", " 0 ", " 0 ", "free"},
		{group, "garbage", "junk", "not a registry name"},
		{group, "garbage", truncated, "10 bytes, want"},
		{group, "arena socket", "in use"},
		{group, relayID, "host", "0B (0)", "3.0MiB (3)", "512B", "192.0KiB (3) [relay_stale 1, no_lane 2]", " 2 ", " 5 ", "1/1", "1.5ms", "ago"},
		{group, senderID, "host", "0B (0)", "0B (0)", "0B", "0B (0)", " 0 ", " 0 ", "0/0", "0s", "never"},
	} {
		if !hasLine(out, want) {
			t.Errorf("no line with %q in:\n%s", want, out)
		}
	}
	if after := dirState(t, root); after != before {
		t.Errorf("inspect changed the registry:\nbefore\n%s\nafter\n%s", before, after)
	}

	out, errOut, code = runInspect(t, "--root", root, "-o", "json")
	if code != 0 {
		t.Fatalf("inspect -o json exited %d: %s", code, errOut)
	}
	var groups []inspect.GroupReport
	if err := json.Unmarshal([]byte(out), &groups); err != nil {
		t.Fatalf("inspect -o json: %v\n%s", err, out)
	}
	if len(groups) != 1 || len(groups[0].Ranks) != 2 || len(groups[0].Entries) != 4 {
		t.Fatalf("json: %+v, want one group with two ranks and four other entries (garbage, arena sockets; host arenas are memfds)", groups)
	}
	for _, r := range groups[0].Ranks {
		if r.File != relay.Name() {
			continue
		}
		if r.PidNS != ns.String() || r.Liveness != inspect.JudgedByPid {
			t.Errorf("json: relay in namespace %q judged by %q, want %q and %q", r.PidNS, r.Liveness, ns, inspect.JudgedByPid)
		}
		l := r.Lanes[0]
		if l.OwnerLiveness != inspect.JudgedByPid {
			t.Errorf("json: lane owner judged by %q, want %q", l.OwnerLiveness, inspect.JudgedByPid)
		}
		if len(r.Lanes) != staging.LaneCount || l.OwnerPid != os.Getpid() || l.Next != 42 || l.Published != 41 || l.Completed != 40 || l.Reaped != 39 {
			t.Errorf("json lanes of the relay: %+v", r.Lanes)
		}
	}
}

// hasLine reports whether some line of out holds every word, in order.
func hasLine(out string, words []string) bool {
	for _, line := range strings.Split(out, "\n") {
		rest, ok := line, true
		for _, w := range words {
			i := strings.Index(rest, w)
			if i < 0 {
				ok = false
				break
			}
			rest = rest[i+len(w):]
		}
		if ok {
			return true
		}
	}
	return false
}

func TestInspectReportsUnsafeDirectoryAndKeepsGoing(t *testing.T) {
	root := inspectRoot(t)
	bad := filepath.Join(root, registry.GroupDirPrefix+strconv.Itoa(os.Geteuid())+"-open")
	if err := os.Mkdir(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(bad, 0o755)
	if err := os.Symlink(bad, filepath.Join(root, registry.GroupDirPrefix+"0-link")); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runInspect(t, "--root", root)
	if code != 0 {
		t.Fatalf("inspect exited %d: %s", code, errOut)
	}
	for _, want := range [][]string{
		{filepath.Base(bad), "directory", "mode 0755"},
		{registry.GroupDirPrefix + "0-link", "directory", "symlink"},
	} {
		if !hasLine(out, want) {
			t.Errorf("no line with %q in:\n%s", want, out)
		}
	}
}

func TestInspectFlags(t *testing.T) {
	root := inspectRoot(t)
	if out, _, code := runInspect(t, "--root", root); code != 0 || !strings.Contains(out, "no registry directories") {
		t.Errorf("empty root: exit %d, %q", code, out)
	}
	for _, args := range [][]string{{"-o", "yaml"}, {"--root", root, "extra"}, {"--nope"}} {
		if _, _, code := runInspect(t, args...); code != 2 {
			t.Errorf("inspect %q exited %d, want 2", args, code)
		}
	}
	if _, errOut, code := runInspect(t, "--root", filepath.Join(root, "missing")); code != 1 || !strings.Contains(errOut, "no such file") {
		t.Errorf("missing root: exit %d, %q", code, errOut)
	}
}

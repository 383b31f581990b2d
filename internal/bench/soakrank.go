// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pxn-project/pxn/internal/sim/fabric"
	"github.com/pxn-project/pxn/pkg/engineopen"
	"github.com/pxn-project/pxn/pkg/relay"
)

// SoakRankOptions are a soak rank's flags, set by the soak.
type SoakRankOptions struct {
	Index     int
	Ranks     int
	Directory string
	Block     uint64
	PerTarget int
	Slots     int
}

// SoakRankMain is one rank of a soak: "round <n> <seed>" writes the round's
// all-to-all requests with the pattern of seed and reports every task;
// "exit" closes the engine.
func SoakRankMain(o SoakRankOptions) int {
	out := json.NewEncoder(os.Stdout)
	if err := runSoakRank(out, o.Index, o.Ranks, o.Directory, o.Block, o.PerTarget, o.Slots); err != nil {
		_ = out.Encode(soakMsg{Event: "error", Error: err.Error()})
		return 1
	}
	return 0
}

// soakHopDepth is a soak rank's TCP hop queue depth: a round's requests
// and the Pieces it relays for others at once.
const soakHopDepth = 256

func runSoakRank(out *json.Encoder, r, ranks int, dirPath string, block uint64, perTarget, slots int) error {
	dir, err := fabric.ReadStaticDirectory(dirPath)
	if err != nil {
		return err
	}
	dev := newHostRank(dir, soakHopDepth)
	defer dev.close()
	n := uint64((ranks-1)*perTarget) * block
	base, err := dev.source(n, 0)
	if err != nil {
		return err
	}
	deps := engineopen.HostDeps{Hop: dev.hop(), Directory: dir, LocalHCA: rankHCA(r)}
	if _, err := dev.firstHop(&deps, base, n); err != nil {
		return err
	}
	eng, err := engineopen.OpenFromEnv(context.Background(), nil, deps)
	if err != nil {
		return err
	}
	src := dev.src
	// Give the relays a moment to appear; a rank whose relay is down sends
	// direct, which the soak allows.
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		all := true
		for k := 0; k < ranks; k++ {
			if k != r && !eng.HasRelay(railName(k)) {
				all = false
			}
		}
		if all {
			break
		}
	}
	if err := out.Encode(soakMsg{Event: "ready", Pid: os.Getpid()}); err != nil {
		return err
	}
	for cmd := range commands() {
		fields := strings.Fields(cmd)
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "round":
			if len(fields) != 3 {
				return fmt.Errorf("command %q", cmd)
			}
			n, _ := strconv.Atoi(fields[1])
			seed, _ := strconv.ParseUint(fields[2], 10, 64)
			msg := soakRound(eng, src, base, r, ranks, n, seed, block, perTarget, slots)
			if err := out.Encode(msg); err != nil {
				return err
			}
		case "exit":
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := eng.Close(ctx)
			cancel()
			msg := soakMsg{Event: "closed"}
			if err != nil {
				msg.Error = err.Error()
			}
			return out.Encode(msg)
		}
	}
	return errors.New("parent went away")
}

type soakReq struct {
	target int
	req    relay.Request
	src    uint64
}

func soakRound(eng *relay.Engine, src []byte, base uintptr, r, ranks, n int, seed, block uint64, perTarget, slots int) soakMsg {
	fillPatternFast(src, seed)
	slot := uint64(n % slots)
	var reqs []soakReq
	t := 0
	for k := 0; k < ranks; k++ {
		if k == r {
			continue
		}
		for j := 0; j < perTarget; j++ {
			off := uint64(t*perTarget+j) * block
			dst := soakBase(k) + ((uint64(r)*uint64(slots)+slot)*uint64(perTarget)+uint64(j))*block
			reqs = append(reqs, soakReq{target: k, src: off,
				req: relay.Request{Op: relay.Write, Src: base + uintptr(off), Len: block, Target: sessionName(k), Dst: dst}})
		}
		t++
	}
	// One Submit per request: one task, one Piece, so the piece counters
	// can be checked against the tasks.
	before := eng.Counters()
	batches := make([]*relay.Batch, len(reqs))
	msg := soakMsg{Event: "round"}
	for i, q := range reqs {
		b, err := eng.Submit([]relay.Request{q.req})
		if err != nil {
			msg.Event, msg.Error = "error", err.Error()
			return msg
		}
		batches[i] = b
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		done := true
		for _, b := range batches {
			done = done && b.Done()
		}
		if done {
			break
		}
		time.Sleep(200 * time.Microsecond)
	}
	for i, b := range batches {
		st, _ := b.Status(0)
		task := soakTask{Target: reqs[i].target, Src: reqs[i].src, Dst: reqs[i].req.Dst, Len: block,
			State: st.State.String(), Transferred: st.Transferred, Route: "direct"}
		if b.Route(0) == relay.RoutePXN {
			task.Route = "pxn"
		}
		if st.Err != nil {
			task.Err = st.Err.Error()
		}
		if st.State == relay.Pending {
			msg.Pending++
		}
		msg.Tasks = append(msg.Tasks, task)
	}
	msg.Counters = diffCounters(eng.Counters(), before)
	sort.Slice(msg.Tasks, func(i, j int) bool { return msg.Tasks[i].Dst < msg.Tasks[j].Dst })
	return msg
}

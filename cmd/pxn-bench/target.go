package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/pxn-project/pxn/pkg/sim/fabric"
)

// targetMain is a remote node's registered buffer on one rail: it serves TCP
// hop writes into it and checks, when asked, that every byte the layout
// sends it is right.
func targetMain(args []string) int {
	fs := flag.NewFlagSet("target", flag.ContinueOnError)
	index := fs.Int("index", 0, "rail of this target")
	layoutPath := fs.String("layout", "", "layout file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	l, err := readLayout(*layoutPath)
	if err != nil {
		emit(event{Event: "error", Error: err.Error()})
		return 1
	}
	buf, err := mapBuffer(l.TargetBytes[*index])
	if err != nil {
		emit(event{Event: "error", Error: err.Error()})
		return 1
	}
	srv := fabric.NewTargetServer(fabric.TargetServerOptions{})
	if err := srv.Register(targetBase, buf); err != nil {
		emit(event{Event: "error", Error: err.Error()})
		return 1
	}
	addr, err := srv.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		emit(event{Event: "error", Error: err.Error()})
		return 1
	}
	defer srv.Close()
	emit(event{Event: "listening", Addr: addr.String()})
	for cmd := range commands() {
		switch cmd {
		case "verify":
			err := verifyTarget(l, *index, buf)
			ev := event{Event: "verified", OK: err == nil}
			if err != nil {
				ev.Error = err.Error()
			}
			emit(ev)
		case "reset":
			clear(buf)
			emit(event{Event: "reset"})
		case "exit":
			return 0
		}
	}
	return 0
}

func verifyTarget(l *layout, k int, buf []byte) error {
	for _, t := range l.ofTarget(k) {
		if err := checkPattern(buf[t.Dst:t.Dst+t.Len], t.Seed, t.Src); err != nil {
			return fmt.Errorf("target %s, data from rank %d: %w", sessionName(k), t.Rank, err)
		}
	}
	return nil
}

// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// Settings of the "hog" role: the folder and name of the arena socket, and
// how many connections it keeps open.
const (
	hogDirEnv   = "PXN_REGISTRY_TEST_HOG_DIR"
	hogSockEnv  = "PXN_REGISTRY_TEST_HOG_SOCK"
	hogConnsEnv = "PXN_REGISTRY_TEST_HOG_CONNS"
)

// helperHog keeps its connections to an arena socket open until stdin
// ends: half of them send nothing, the other half a byte a round, never a
// whole request, and each one the server closes is opened again. It says
// "holding <n>" once it has opened every one.
func helperHog() int {
	n, err := strconv.Atoi(os.Getenv(hogConnsEnv))
	if err != nil || n <= 0 {
		fmt.Fprintf(os.Stderr, "hog: bad %s %q\n", hogConnsEnv, os.Getenv(hogConnsEnv))
		return 2
	}
	dir, err := unix.Open(os.Getenv(hogDirEnv), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hog: open %s: %v\n", os.Getenv(hogDirEnv), err)
		return 2
	}
	addr := &unix.SockaddrUnix{Name: "/proc/self/fd/" + strconv.Itoa(dir) + "/" + os.Getenv(hogSockEnv)}
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	conns, sent := make([]int, n), make([]int, n)
	for i := range conns {
		conns[i] = -1
	}
	dials, announced := 0, false
	for {
		select {
		case <-stop:
			return 0
		default:
		}
		for i := range conns {
			if conns[i] < 0 {
				fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					continue
				}
				if err := unix.Connect(fd, addr); err != nil {
					unix.Close(fd)
					continue
				}
				conns[i], sent[i] = fd, 0
				dials++
			}
			if i%2 == 1 && sent[i] < fdRequestSize-1 {
				if k, _ := unix.Write(conns[i], []byte{'P'}); k == 1 {
					sent[i]++
				}
			}
			var b [fdAnswerSize]byte
			if k, err := unix.Read(conns[i], b[:]); k == 0 && err == nil || err != nil && !errors.Is(err, unix.EAGAIN) {
				unix.Close(conns[i])
				conns[i] = -1
			}
		}
		if !announced && dials >= n {
			fmt.Println("holding", n)
			announced = true
		}
		time.Sleep(time.Millisecond)
	}
}

// A peer of the registry's uid keeps four times as many connections to a
// relay's arena socket open as the relay lets wait, stalling or trickling
// bytes, and opens each again as soon as it is closed: a sender that
// holds a lane still gets the relay's arena by descriptor, every time.
func TestArenaSocketServesTheHolderPastAHog(t *testing.T) {
	root := regTestRoot(t)
	relay := mustRegister(t, regOptions(root, "g", "rail0"))
	sender := mustRegister(t, regOptions(root, "g", "rail1"))
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const conns = 4 * sockMaxWaiting
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), registryHelperEnv+"=hog", hogDirEnv+"="+relay.Dir(),
		hogSockEnv+"="+folder.SockFileName(relay.Identity()), hogConnsEnv+"="+strconv.Itoa(conns))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("hog: %v: %s", err, stderr.String())
		}
	})
	lines := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	select {
	case l, ok := <-lines:
		if want := fmt.Sprint("holding ", conns); !ok || l != want {
			t.Fatalf("hog said %q (open %v), want %q: %s", l, ok, want, stderr.String())
		}
	case <-time.After(childWait):
		t.Fatalf("hog silent after %v: %s", childWait, stderr.String())
	}

	const attaches = 10
	for i := range attaches {
		l := attachByName(t, sender, relay.Name())
		share := l.ArenaShare()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if share != staging.ShareLaneFD {
			t.Fatalf("attach %d beside the hog mapped the arena by %s, want by lane descriptor (serve stats %+v)", i, folder.ShareName(share), relay.ServeStats())
		}
	}
	// The server counts after it answers: wait for it.
	pollUntil(t, "the server to count its answers", func() bool { return relay.ServeStats().Served >= attaches })
	if st := relay.ServeStats(); st.Served != attaches || st.Busy == 0 {
		t.Errorf("serve stats %+v: want %d served and the hog's connections dropped to make room", st, attaches)
	}
}

// Which waiting connection a newcomer displaces: the oldest of its own
// peer's when the peer is at its bound, else, when every place is taken,
// the oldest of the peer with the most waiting (the lowest pid among
// equals); none while there is room.
func TestArenaSocketWaitingPlaces(t *testing.T) {
	for _, tt := range []struct {
		name    string
		waiting []int32
		pid     int32
		dropped int
	}{
		{"room", []int32{1, 2}, 3, -1},
		{"room for a second of a peer", []int32{1, 2}, 1, -1},
		{"peer at its bound", []int32{5, 7, 5}, 5, 0},
		{"all taken", []int32{1, 3, 2, 3, 4, 2, 4, 6}, 9, 2},
		{"all taken, the newcomer's peer at its bound", []int32{1, 3, 2, 3, 4, 2, 4, 6}, 4, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := &arenaServer{}
			for _, pid := range tt.waiting {
				s.waiting = append(s.waiting, &waitingConn{c: pipeConn(t), pid: pid})
			}
			s.admit(&waitingConn{c: pipeConn(t), pid: tt.pid})
			for i, w := range s.waiting[:len(tt.waiting)] {
				if w.dropped != (i == tt.dropped) {
					t.Errorf("waiting %d (pid %d) dropped %v, want the one at %d dropped", i, w.pid, w.dropped, tt.dropped)
				}
			}
			if want := uint64(min(tt.dropped+1, 1)); s.busy.Load() != want || len(s.waiting) != len(tt.waiting)+1 {
				t.Errorf("busy %d, %d waiting; want %d and %d", s.busy.Load(), len(s.waiting), want, len(tt.waiting)+1)
			}
		})
	}
}

// pipeConn is one end of a connected pair of unix sockets.
func pipeConn(t *testing.T) *net.UnixConn {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fds[1])
	f := os.NewFile(uintptr(fds[0]), "pair")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.UnixConn)
}

// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/pxn-project/pxn/pkg/relay"
)

// soakTask is one task of a round as its rank reports it.
type soakTask struct {
	Target      int    `json:"target"`
	Src         uint64 `json:"src"`
	Dst         uint64 `json:"dst"`
	Len         uint64 `json:"len"`
	State       string `json:"state"`
	Route       string `json:"route"`
	Transferred uint64 `json:"transferred"`
	Err         string `json:"err,omitempty"`
}

// soakMsg is one line a soak rank prints.
type soakMsg struct {
	Event    string                `json:"event"`
	Pid      int                   `json:"pid,omitempty"`
	Error    string                `json:"error,omitempty"`
	Tasks    []soakTask            `json:"tasks,omitempty"`
	Pending  int                   `json:"pending,omitempty"`
	Counters relay.CounterSnapshot `json:"counters"`
}

type soakChild struct {
	cmd    *exec.Cmd
	pid    int
	in     io.WriteCloser
	lines  chan []byte
	exited chan struct{}
	stderr *strings.Builder
}

func startSoakChild(exe string, env []string, args ...string) (*soakChild, error) {
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c := &soakChild{cmd: cmd, lines: make(chan []byte, 4), exited: make(chan struct{}), stderr: &strings.Builder{}}
	cmd.Stderr = limitWriter{c.stderr}
	var err error
	if c.in, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c.pid = cmd.Process.Pid
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			c.lines <- append([]byte(nil), sc.Bytes()...)
		}
	}()
	go func() {
		_ = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

func (c *soakChild) alive() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

func (c *soakChild) read(timeout time.Duration) (*soakMsg, error) {
	select {
	case line, ok := <-c.lines:
		if !ok {
			<-c.exited
			return nil, fmt.Errorf("exited (%v): %s", c.cmd.ProcessState, lastLines(problems(c.stderr.String()), 10))
		}
		var m soakMsg
		if err := json.Unmarshal(line, &m); err != nil {
			return nil, fmt.Errorf("unparsable output %q", line)
		}
		if m.Event == "error" {
			return nil, errors.New(m.Error)
		}
		return &m, nil
	case <-time.After(timeout):
		return nil, fmt.Errorf("no answer within %v (hung)", timeout)
	}
}

func (c *soakChild) round(n int, seed uint64, timeout time.Duration) (*soakMsg, error) {
	if _, err := fmt.Fprintf(c.in, "round %d %d\n", n, seed); err != nil {
		return nil, err
	}
	return c.read(timeout)
}

// exit closes the rank's engine and waits for the process.
func (c *soakChild) exit(timeout time.Duration) error {
	if !c.alive() {
		return nil
	}
	if _, err := fmt.Fprintln(c.in, "exit"); err != nil {
		return err
	}
	m, err := c.read(timeout)
	if err != nil {
		c.kill()
		return err
	}
	// A graceful close completes or fails everything and gets every lane
	// back within the drain: any error from it is a violation.
	if m.Error != "" {
		c.kill()
		return fmt.Errorf("close: %s", m.Error)
	}
	select {
	case <-c.exited:
	case <-time.After(timeout):
		c.kill()
		return fmt.Errorf("did not exit within %v", timeout)
	}
	if !c.cmd.ProcessState.Success() {
		return fmt.Errorf("exited with %v after %q", c.cmd.ProcessState, m.Event)
	}
	return nil
}

func (c *soakChild) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exited
}

// problems drops klog's info lines from a rank's stderr.
func problems(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(l, "I1") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

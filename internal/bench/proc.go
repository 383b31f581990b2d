// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// child is a rank or target process of a run.
type child struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan event
	stderr *strings.Builder
}

func startChild(name string, env []string, args ...string) (*child, error) {
	return startChildAttr(name, nil, env, args...)
}

func startChildAttr(name string, attr *syscall.SysProcAttr, env []string, args ...string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = attr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c := &child{name: name, cmd: cmd, stdin: stdin, events: make(chan event, 16), stderr: &strings.Builder{}}
	cmd.Stderr = limitWriter{c.stderr}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		defer close(c.events)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var ev event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				ev = event{Event: "error", Error: "unparsable output: " + sc.Text()}
			}
			c.events <- ev
		}
	}()
	return c, nil
}

// limitWriter keeps the first 64 KiB of a child's stderr for error reports.
type limitWriter struct{ b *strings.Builder }

func (w limitWriter) Write(p []byte) (int, error) {
	if w.b.Len() < 64<<10 {
		w.b.Write(p[:min(len(p), 64<<10-w.b.Len())])
	}
	return len(p), nil
}

func (c *child) send(cmd string) error {
	_, err := fmt.Fprintln(c.stdin, cmd)
	return err
}

// expect waits for the next event named want.
func (c *child) expect(want string, timeout time.Duration) (event, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				_ = c.cmd.Wait()
				return event{}, fmt.Errorf("%s exited before %q (%v): %s", c.name, want, c.cmd.ProcessState, lastLines(c.stderr.String(), 10))
			}
			if ev.Event == "error" {
				return ev, fmt.Errorf("%s: %s", c.name, ev.Error)
			}
			if ev.Event == want {
				return ev, nil
			}
		case <-t.C:
			return event{}, fmt.Errorf("%s: no %q within %v", c.name, want, timeout)
		}
	}
}

func (c *child) kill() {
	if c.cmd.Process != nil {
		_ = c.cmd.Process.Kill()
	}
	_ = c.cmd.Wait()
}

func (c *child) wait(timeout time.Duration) error {
	_ = c.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		c.kill()
		return fmt.Errorf("%s did not exit within %v", c.name, timeout)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// all sends cmd to every child and waits for the event want from each.
func all(cs []*child, cmd, want string, timeout time.Duration) ([]event, error) {
	for _, c := range cs {
		if cmd != "" {
			if err := c.send(cmd); err != nil {
				return nil, fmt.Errorf("%s: %w", c.name, err)
			}
		}
	}
	evs := make([]event, len(cs))
	for i, c := range cs {
		ev, err := c.expect(want, timeout)
		if err != nil {
			return nil, err
		}
		evs[i] = ev
	}
	return evs, nil
}

// inTurn sends cmd to one child at a time, each after the one before
// answered with an event of the same name.
func inTurn(cs []*child, cmd string, timeout time.Duration) ([]event, error) {
	evs := make([]event, 0, len(cs))
	for i := range cs {
		ev, err := all(cs[i:i+1], cmd, cmd, timeout)
		if err != nil {
			return nil, err
		}
		evs = append(evs, ev...)
	}
	return evs, nil
}

// procSet is every child process of a run, so that a run stopped by a
// signal ends them all before it removes the folders they use. Only the
// goroutine that started a child waits for it; stop only signals.
type procSet struct {
	mu    sync.Mutex
	cs    []*child
	cause error
	// done is closed by the first stop.
	done chan struct{}
}

func newProcSet() *procSet { return &procSet{done: make(chan struct{})} }

// add records c; once the set is stopped it ends c instead and returns the
// cause.
func (p *procSet) add(c *child) error {
	p.mu.Lock()
	cause := p.cause
	if cause == nil {
		p.cs = append(p.cs, c)
	}
	p.mu.Unlock()
	if cause != nil {
		c.kill()
		return cause
	}
	return nil
}

// stop kills every child recorded and refuses further ones with cause.
func (p *procSet) stop(cause error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cause != nil {
		return
	}
	p.cause = cause
	close(p.done)
	for _, c := range p.cs {
		if c.cmd.Process != nil {
			_ = c.cmd.Process.Kill()
		}
	}
	p.cs = nil
}

// stopped returns the cause the set was stopped with, nil while it runs.
func (p *procSet) stopped() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cause
}

// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"context"
	"errors"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/cpucopy"
	"github.com/pxn-project/pxn/pkg/engineopen"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/sim/fabric"
)

// hostRank is a rank on the host path: host memory stands in for its GPU's,
// the host copier for NVLink and a TCP hop on loopback for RDMA.
type hostRank struct {
	dir *fabric.StaticDirectory
	tcp *fabric.TCPHop
	src []byte
}

// newHostRank makes a rank's TCP hop to the directory's targets; depth 0
// is the hop's default queue depth.
func newHostRank(dir *fabric.StaticDirectory, depth int) *hostRank {
	return &hostRank{dir: dir, tcp: fabric.NewTCPHop(fabric.TCPHopOptions{Targets: dir.Addresses(), QueueDepth: depth})}
}

func (h *hostRank) source(n, seed uint64) (uintptr, error) {
	src, err := mapBuffer(n)
	if err != nil {
		return 0, err
	}
	fillPatternFast(src, seed)
	h.src = src
	return uintptr(unsafe.Pointer(&src[0])), nil
}

func (h *hostRank) hop() relay.Hop { return h.tcp }

func (h *hostRank) newHop() (relay.Hop, error) {
	return fabric.NewTCPHop(fabric.TCPHopOptions{Targets: h.dir.Addresses()}), nil
}

func (h *hostRank) firstHop(deps *engineopen.HostDeps, src uintptr, n uint64) (string, error) {
	c := cpucopy.NewHostCopier(cpucopy.HostCopierOptions{})
	if err := c.RegisterDevice(src, n); err != nil {
		return "", err
	}
	deps.Copier = c
	return "host copier", nil
}

func (h *hostRank) freeMemory() (uint64, bool) { return 0, false }

func (h *hostRank) rawCopy([]relay.Request, uint64, int) (*rawResult, error) {
	return nil, errors.New("a raw copy-engine copy needs --device cuda")
}

func (h *hostRank) spin() bool { return false }

func (h *hostRank) close() error { return h.tcp.Close() }

// hostTarget is a remote node's registered buffer in host memory, written
// by the ranks' TCP hops.
type hostTarget struct {
	buf []byte
	srv *fabric.TargetServer
}

func newHostTarget(n uint64) (*hostTarget, string, error) {
	buf, err := mapBuffer(n)
	if err != nil {
		return nil, "", err
	}
	t := &hostTarget{buf: buf, srv: fabric.NewTargetServer(fabric.TargetServerOptions{})}
	if err := t.srv.Register(targetBase, buf); err != nil {
		return nil, "", err
	}
	addr, err := t.srv.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		return nil, "", errors.Join(err, t.srv.Close())
	}
	return t, addr.String(), nil
}

func (t *hostTarget) received() ([]byte, error) { return t.buf, nil }

func (t *hostTarget) reset() error {
	clear(t.buf)
	return nil
}

func (t *hostTarget) close() error { return t.srv.Close() }

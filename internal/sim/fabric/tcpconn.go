// SPDX-License-Identifier: Apache-2.0

package fabric

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/pxn-project/pxn/pkg/memrange"
	"github.com/pxn-project/pxn/pkg/relay"
)

// tcpConn is one connection to a target address and its two goroutines.
type tcpConn struct {
	hop   *TCPHop
	peer  *tcpPeer
	addr  string
	queue chan relay.WriteOp
	// pending counts ops accepted for this connection and not completed;
	// guarded by hop.mu.
	pending int
	// dead is closed by fail after the connection has left its peer, so
	// no op reaches queue once it is closed.
	dead chan struct{}

	mu       sync.Mutex
	failed   bool
	cause    error
	nc       net.Conn
	nextID   uint64
	inflight map[uint64]relay.WriteOp

	// Owned by the sender goroutine.
	hdr  [frameHeaderSize]byte
	iov  [2][]byte
	bufs net.Buffers
}

func newTCPConn(h *TCPHop, p *tcpPeer) *tcpConn {
	return &tcpConn{
		hop:      h,
		peer:     p,
		addr:     p.addr,
		queue:    make(chan relay.WriteOp, h.depth),
		dead:     make(chan struct{}),
		inflight: make(map[uint64]relay.WriteOp),
	}
}

// run dials and then sends the queued ops in order until the connection
// fails, then fails whatever is still queued.
func (c *tcpConn) run() {
	defer c.hop.wg.Done()
	defer c.drain()
	d := net.Dialer{Timeout: c.hop.dialTimeout}
	nc, err := d.DialContext(c.hop.ctx, "tcp", c.addr)
	if err != nil {
		c.fail(fmt.Errorf("dial: %w", err))
		return
	}
	c.mu.Lock()
	if c.failed {
		c.mu.Unlock()
		_ = nc.Close()
		return
	}
	c.nc = nc
	c.mu.Unlock()
	c.hop.mu.Lock()
	c.hop.stats.Dials++
	c.hop.mu.Unlock()
	c.hop.wg.Add(1)
	go c.readAcks(nc)
	for {
		select {
		case op := <-c.queue:
			c.send(nc, op)
		case <-c.dead:
			return
		}
	}
}

func (c *tcpConn) send(nc net.Conn, op relay.WriteOp) {
	c.mu.Lock()
	if c.failed {
		cause := c.cause
		c.mu.Unlock()
		c.hop.complete(c, op, c.lost(op, cause))
		return
	}
	c.nextID++
	id := c.nextID
	c.inflight[id] = op
	c.mu.Unlock()

	frameHeader{kind: kindWrite, id: id, arg: op.Dst, length: op.Len}.encode(&c.hdr)
	c.iov = [2][]byte{c.hdr[:], memrange.Bytes(op.Src, op.Len)}
	c.bufs = c.iov[:]
	if err := nc.SetWriteDeadline(time.Now().Add(c.hop.writeTimeout)); err != nil {
		c.fail(fmt.Errorf("set write deadline: %w", err))
		return
	}
	if _, err := c.bufs.WriteTo(nc); err != nil {
		c.fail(fmt.Errorf("write: %w", err))
	}
	c.iov = [2][]byte{}
}

func (c *tcpConn) readAcks(nc net.Conn) {
	defer c.hop.wg.Done()
	var hdr [frameHeaderSize]byte
	msg := make([]byte, maxAckMessage)
	for {
		if _, err := io.ReadFull(nc, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("closed by target")
			}
			c.fail(fmt.Errorf("read ack: %w", err))
			return
		}
		h, err := decodeFrameHeader(hdr[:])
		if err == nil && h.kind != kindAck {
			err = fmt.Errorf("unexpected frame kind %d from a target", h.kind)
		}
		if err != nil {
			c.fail(fmt.Errorf("protocol: %w", err))
			return
		}
		m := msg[:h.length]
		if _, err := io.ReadFull(nc, m); err != nil {
			c.fail(fmt.Errorf("read ack message: %w", err))
			return
		}
		c.mu.Lock()
		op, ok := c.inflight[h.id]
		delete(c.inflight, h.id)
		failed := c.failed
		c.mu.Unlock()
		if !ok {
			if !failed {
				c.fail(fmt.Errorf("protocol: ack for unknown request %d", h.id))
			}
			return
		}
		var opErr error
		if st := h.status(); st != statusOK {
			opErr = fmt.Errorf("%w: token %d to %q at %s dst %#x len %d: status %d: %s",
				ErrWriteRefused, op.Token, op.Target, c.addr, op.Dst, op.Len, st, m)
		}
		c.hop.complete(c, op, opErr)
	}
}

func (c *tcpConn) lost(op relay.WriteOp, cause error) error {
	return fmt.Errorf("%w: token %d to %q at %s: %w", ErrTargetLost, op.Token, op.Target, c.addr, cause)
}

// fail ends the connection once: it leaves its peer (so the next Submit for
// the address starts a new connection), closes the socket and fails
// every op sent and not acked. The sender goroutine then fails the queue.
func (c *tcpConn) fail(cause error) {
	c.mu.Lock()
	if c.failed {
		c.mu.Unlock()
		return
	}
	c.failed = true
	c.cause = cause
	nc := c.nc
	inflight := c.inflight
	c.inflight = nil
	c.mu.Unlock()

	c.hop.mu.Lock()
	if c.peer.conn == c {
		c.peer.conn = nil
	}
	c.hop.mu.Unlock()
	close(c.dead)
	if nc != nil {
		_ = nc.Close()
	}
	ids := make([]uint64, 0, len(inflight))
	for id := range inflight {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		op := inflight[id]
		c.hop.complete(c, op, c.lost(op, cause))
	}
}

// drain fails every op still queued. It runs on the sender goroutine after
// fail, when nothing can be added to the queue any more.
func (c *tcpConn) drain() {
	<-c.dead
	for {
		select {
		case op := <-c.queue:
			c.hop.complete(c, op, c.lost(op, c.cause))
		default:
			return
		}
	}
}

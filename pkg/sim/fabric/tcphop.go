// SPDX-License-Identifier: Apache-2.0

package fabric

import (
	"context"
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

var (
	// ErrTargetLost is wrapped by the completion of every op that was
	// accepted for a target connection that then failed (dial, write, read
	// or protocol error) before the op's ack arrived.
	ErrTargetLost = errors.New("fabric: connection to target lost")
	// ErrWriteRefused is wrapped by the completion of an op that its target
	// acked with a failure status.
	ErrWriteRefused = errors.New("fabric: target refused write")
)

// DefaultTCPQueueDepth is the per-address queue depth of a TCPHop whose
// options leave it zero.
const DefaultTCPQueueDepth = 64

// DefaultDialTimeout bounds a TCPHop dial when its options leave it zero.
const DefaultDialTimeout = 5 * time.Second

// TCPHopOptions configures a TCPHop.
type TCPHopOptions struct {
	// Targets maps a session name to its target server's TCP address.
	Targets map[string]string
	// QueueDepth bounds, per target address, the ops accepted and not yet
	// completed; beyond it Submit returns relay.ErrHopBusy. Zero means
	// DefaultTCPQueueDepth.
	QueueDepth int
	// DialTimeout bounds a dial. Zero means DefaultDialTimeout.
	DialTimeout time.Duration
	// WriteTimeout bounds the write of one frame. Zero means
	// DefaultWriteTimeout.
	WriteTimeout time.Duration
}

// TCPHopStats are a TCPHop's counters.
type TCPHopStats struct {
	// Dials counts connections established.
	Dials uint64
	// Submitted counts ops accepted by Submit.
	Submitted uint64
	// Succeeded and Failed count completions.
	Succeeded uint64
	Failed    uint64
	// Busy counts Submit calls answered with relay.ErrHopBusy.
	Busy uint64
	// Routes counts Route calls.
	Routes uint64
	// Routed counts ops queued through their route handle. Lookups counts
	// lookups of an op's session by name, made for ops without a handle
	// (again for a batch refused as busy).
	Routed  uint64
	Lookups uint64
}

// TCPHop is a relay.Hop that sends each write to its target's TargetServer
// over TCP. There is one connection per target address, dialed by the
// connection's sender goroutine when the first op for the address arrives; a
// reader goroutine per connection turns acks into completions. A connection
// that fails fails every op it holds and is dropped; the next Submit for its
// address starts a new one.
//
// TCPHop is also a relay.Router. A route handle is the session's address
// record, which outlives the address's connections: an op that carries it is
// queued without a lookup of its session, and after a reconnect it goes to
// the same address as an op without it would. AddTarget to another address
// and RemoveTarget retire the session's handle. An op whose handle is
// retired, or was not issued by this hop for the op's Target, completes with
// ErrStaleRoute (and ErrUnknownSession once the session is removed) and is
// not sent: sending it to the session's new address would be a guess.
type TCPHop struct {
	depth        int
	dialTimeout  time.Duration
	writeTimeout time.Duration
	ctx          context.Context
	cancel       context.CancelFunc
	wg           sync.WaitGroup

	mu     sync.Mutex
	closed bool
	// book maps a session to its address's peer; peers holds a peer for
	// every address ever mapped; routes the live handle of each session
	// that has one.
	book   map[string]*tcpPeer
	peers  map[string]*tcpPeer
	routes map[string]*tcpRoute
	// plan and touched are Submit's scratch space.
	plan    []tcpPlan
	touched []*tcpPeer
	done    []relay.HopCompletion
	stats   TCPHopStats
}

// tcpPeer is a target address and its current connection.
type tcpPeer struct {
	addr string
	// conn is the live connection, or nil until the next op after the
	// last one failed. Guarded by hop.mu.
	conn *tcpConn
	// need counts this address's ops in the Submit under way.
	need int
}

// tcpRoute is the handle Route returns for a session.
type tcpRoute struct {
	hop     *TCPHop
	session string
	peer    *tcpPeer
	// retired is set, under hop.mu, once the session is removed or mapped
	// to another address.
	retired bool
}

// tcpPlan is where Submit sends one op: peer, or nowhere, failing it with
// err.
type tcpPlan struct {
	peer *tcpPeer
	err  error
}

var (
	_ relay.Hop    = (*TCPHop)(nil)
	_ relay.Router = (*TCPHop)(nil)
)

// NewTCPHop returns a hop. It dials nothing and starts no goroutine until the
// first Submit.
func NewTCPHop(opts TCPHopOptions) *TCPHop {
	h := &TCPHop{
		depth:        opts.QueueDepth,
		dialTimeout:  opts.DialTimeout,
		writeTimeout: opts.WriteTimeout,
		book:         make(map[string]*tcpPeer, len(opts.Targets)),
		peers:        make(map[string]*tcpPeer),
		routes:       make(map[string]*tcpRoute),
	}
	if h.depth <= 0 {
		h.depth = DefaultTCPQueueDepth
	}
	if h.dialTimeout <= 0 {
		h.dialTimeout = DefaultDialTimeout
	}
	if h.writeTimeout <= 0 {
		h.writeTimeout = DefaultWriteTimeout
	}
	for session, addr := range opts.Targets {
		h.book[session] = h.peerAt(addr)
	}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	return h
}

// peerAt returns the peer of addr, making it on first use. h.mu is held, or
// h is not shared yet.
func (h *TCPHop) peerAt(addr string) *tcpPeer {
	p := h.peers[addr]
	if p == nil {
		p = &tcpPeer{addr: addr}
		h.peers[addr] = p
	}
	return p
}

// AddTarget maps session to the target server at addr, replacing an earlier
// mapping. Ops already accepted keep their address. Moving a session to
// another address retires its route handle.
func (h *TCPHop) AddTarget(session, addr string) error {
	if session == "" || addr == "" {
		return fmt.Errorf("fabric: TCP target needs a session and an address (session %q, addr %q)", session, addr)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if p := h.book[session]; p != nil && p.addr == addr {
		return nil
	}
	h.retire(session)
	h.book[session] = h.peerAt(addr)
	return nil
}

// RemoveTarget forgets session's address and retires its route handle. Ops
// already accepted keep their address; later ones to session fail with
// ErrUnknownSession.
func (h *TCPHop) RemoveTarget(session string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.book[session] == nil {
		return fmt.Errorf("fabric: remove TCP target: %w: %q has no address", ErrUnknownSession, session)
	}
	delete(h.book, session)
	h.retire(session)
	return nil
}

// retire ends session's route handle, if it has one. h.mu is held.
func (h *TCPHop) retire(session string) {
	if r := h.routes[session]; r != nil {
		r.retired = true
		delete(h.routes, session)
	}
}

// Route returns the hop's handle for session, for WriteOp.Route: the same
// handle until AddTarget moves the session or RemoveTarget removes it. It
// dials nothing.
func (h *TCPHop) Route(session string) (any, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stats.Routes++
	if h.closed {
		return nil, ErrClosed
	}
	p := h.book[session]
	if p == nil {
		return nil, fmt.Errorf("fabric: TCP route: %w: %q has no address", ErrUnknownSession, session)
	}
	r := h.routes[session]
	if r == nil {
		r = &tcpRoute{hop: h, session: session, peer: p}
		h.routes[session] = r
	}
	return r, nil
}

// Submit accepts every op of ops or, when some address has no room for its
// share of them, none and returns relay.ErrHopBusy. An op that cannot be sent
// at all (unknown session, route handle not honoured, no source, too long)
// is accepted and completes with an error.
func (h *TCPHop) Submit(ops []relay.WriteOp) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	h.plan, h.touched = h.plan[:0], h.touched[:0]
	for _, op := range ops {
		p, err := h.peerOf(op)
		if err == nil {
			if err = sendable(op); err != nil {
				p, err = nil, fmt.Errorf("fabric: TCP write token %d to %q at %s: %w", op.Token, op.Target, p.addr, err)
			}
		}
		h.plan = append(h.plan, tcpPlan{peer: p, err: err})
		if p != nil {
			if p.need == 0 {
				h.touched = append(h.touched, p)
			}
			p.need++
		}
	}
	if err := h.room(); err != nil {
		clear(h.plan)
		return err
	}
	h.stats.Submitted += uint64(len(ops))
	for i, op := range ops {
		p := h.plan[i].peer
		if p == nil {
			h.completeLocked(nil, op, h.plan[i].err)
			continue
		}
		if op.Route != nil {
			h.stats.Routed++
		}
		c := p.conn
		if c == nil {
			c = newTCPConn(h, p)
			p.conn = c
			h.wg.Add(1)
			go c.run()
		}
		c.pending++
		// pending never exceeds depth, the queue's capacity: no blocking.
		c.queue <- op
	}
	clear(h.plan)
	return nil
}

// peerOf returns the peer that op goes to: its route handle's, or, without
// one, its session's. h.mu is held.
func (h *TCPHop) peerOf(op relay.WriteOp) (*tcpPeer, error) {
	if op.Route == nil {
		h.stats.Lookups++
		p := h.book[op.Target]
		if p == nil {
			return nil, fmt.Errorf("fabric: TCP write token %d: %w: %q has no address", op.Token, ErrUnknownSession, op.Target)
		}
		return p, nil
	}
	r, ok := op.Route.(*tcpRoute)
	switch {
	case !ok || r.hop != h:
		return nil, fmt.Errorf("fabric: TCP write token %d to %q: %w: handle %T was not issued by this hop", op.Token, op.Target, ErrStaleRoute, op.Route)
	case r.session != op.Target:
		return nil, fmt.Errorf("fabric: TCP write token %d to %q: %w: handle is for session %q", op.Token, op.Target, ErrStaleRoute, r.session)
	case r.retired:
		if p := h.book[op.Target]; p != nil {
			return nil, fmt.Errorf("fabric: TCP write token %d to %q: %w: the session moved from %s to %s", op.Token, op.Target, ErrStaleRoute, r.peer.addr, p.addr)
		}
		return nil, fmt.Errorf("fabric: TCP write token %d: %w: %w: %q was removed", op.Token, ErrStaleRoute, ErrUnknownSession, op.Target)
	}
	return r.peer, nil
}

// room checks that every address touched by the Submit under way has room
// for its ops, and resets their counts. h.mu is held.
func (h *TCPHop) room() error {
	var err error
	for _, p := range h.touched {
		n := p.need
		p.need = 0
		if err != nil {
			continue
		}
		pending := 0
		if p.conn != nil {
			pending = p.conn.pending
		}
		if n > h.depth {
			err = fmt.Errorf("fabric: batch holds %d ops for %s, more than the queue depth %d", n, p.addr, h.depth)
		} else if pending+n > h.depth {
			h.stats.Busy++
			err = relay.ErrHopBusy
		}
	}
	return err
}

func sendable(op relay.WriteOp) error {
	if op.Len > maxPayload {
		return fmt.Errorf("length %d exceeds the frame limit of %d", op.Len, maxPayload)
	}
	if op.Len > 0 && (op.Src == 0 || !memrange.ValidRange(uint64(op.Src), op.Len)) {
		return fmt.Errorf("source %#x len %d is not addressable", op.Src, op.Len)
	}
	return nil
}

// Poll moves up to len(out) completions into out.
func (h *TCPHop) Poll(out []relay.HopCompletion) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return pollInto(out, &h.done)
}

// Stats returns the hop's counters.
func (h *TCPHop) Stats() TCPHopStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats
}

func (h *TCPHop) complete(c *tcpConn, op relay.WriteOp, err error) {
	h.mu.Lock()
	h.completeLocked(c, op, err)
	h.mu.Unlock()
}

func (h *TCPHop) completeLocked(c *tcpConn, op relay.WriteOp, err error) {
	if c != nil {
		c.pending--
	}
	if err != nil {
		h.stats.Failed++
	} else {
		h.stats.Succeeded++
	}
	h.done = append(h.done, relay.HopCompletion{Token: op.Token, Err: err})
}

// Close fails every op not yet acked with ErrClosed (their completions stay
// pollable), closes the connections and waits for the hop's goroutines.
func (h *TCPHop) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	var conns []*tcpConn
	for _, p := range h.peers {
		if p.conn != nil {
			conns = append(conns, p.conn)
		}
	}
	h.mu.Unlock()
	h.cancel()
	for _, c := range conns {
		c.fail(ErrClosed)
	}
	h.wg.Wait()
	return nil
}

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

// SPDX-License-Identifier: Apache-2.0

package fabric

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/memrange"
)

// DefaultWriteTimeout bounds one frame write of the TCP hop and of a target
// server when their options leave it zero.
const DefaultWriteTimeout = 30 * time.Second

// TargetServerOptions configures a TargetServer.
type TargetServerOptions struct {
	// Logger receives one line per connection closed on an error. The zero
	// value means klog.Background().
	Logger klog.Logger
	// WriteTimeout bounds the write of one ack. Zero means
	// DefaultWriteTimeout.
	WriteTimeout time.Duration
}

// TargetServerStats are a TargetServer's counters.
type TargetServerStats struct {
	// Writes counts write frames performed; Bytes their payload.
	Writes uint64
	Bytes  uint64
	// Refused counts write frames acked with a failure.
	Refused uint64
	// BadFrames counts connections closed on a header that did not decode.
	BadFrames uint64
	// Accepted counts connections accepted.
	Accepted uint64
}

// TargetServer is the far end of the TCP hop: it owns registered memory
// ranges, like RDMA memory regions, and performs the writes that TCPHop
// clients send to them.
type TargetServer struct {
	log          klog.Logger
	writeTimeout time.Duration

	memMu sync.RWMutex
	spans memrange.Spans
	bufs  [][]byte

	connMu sync.Mutex
	closed bool
	ln     net.Listener
	conns  map[net.Conn]struct{}
	// closing is closed once Close has closed every connection.
	closing chan struct{}
	wg      sync.WaitGroup

	writes, bytes, refused, badFrames, accepted atomic.Uint64

	// afterAck, when set by a test, runs after every ack with the number
	// of acks this server has sent.
	afterAck func(n uint64)
	acks     atomic.Uint64
}

// NewTargetServer returns a server with no memory and no listener.
func NewTargetServer(opts TargetServerOptions) *TargetServer {
	log := opts.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	wt := opts.WriteTimeout
	if wt <= 0 {
		wt = DefaultWriteTimeout
	}
	return &TargetServer{
		log:          log,
		writeTimeout: wt,
		conns:        make(map[net.Conn]struct{}),
		closing:      make(chan struct{}),
	}
}

// Register makes buf writable by clients as [base, base+len(buf)). The server
// writes into buf, from its connection goroutines, for as long as it runs.
func (s *TargetServer) Register(base uint64, buf []byte) error {
	size := uint64(len(buf))
	if !memrange.ValidRange(base, size) {
		return fmt.Errorf("fabric: invalid target range %#x+%d", base, size)
	}
	s.memMu.Lock()
	defer s.memMu.Unlock()
	if s.spans.Overlaps(base, size) {
		return fmt.Errorf("fabric: target range %#x+%d overlaps a registered range", base, size)
	}
	s.bufs = append(s.bufs, buf)
	s.spans = s.spans.Insert(memrange.Span{Start: base, Size: size, Ref: len(s.bufs) - 1})
	return nil
}

// lookup returns the registered bytes [dst, dst+n), or nil, false.
func (s *TargetServer) lookup(dst, n uint64) ([]byte, bool) {
	s.memMu.RLock()
	defer s.memMu.RUnlock()
	i := s.spans.Find(dst, n)
	if i < 0 {
		return nil, false
	}
	sp := s.spans[i]
	off := dst - sp.Start
	return s.bufs[sp.Ref][off : off+n], true
}

// Listen listens on the TCP address addr ("127.0.0.1:0" picks a port) and
// serves connections in the background until Close. ctx bounds only the
// setting up of the listener.
func (s *TargetServer) Listen(ctx context.Context, addr string) (net.Addr, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fabric: target server listen on %s: %w", addr, err)
	}
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.closed || s.ln != nil {
		_ = ln.Close()
		if s.closed {
			return nil, ErrClosed
		}
		return nil, fmt.Errorf("fabric: target server already listens on %s", s.ln.Addr())
	}
	s.ln = ln
	s.wg.Add(1)
	go s.accept(ln)
	return ln.Addr(), nil
}

func (s *TargetServer) accept(ln net.Listener) {
	defer s.wg.Done()
	for {
		nc, err := ln.Accept()
		if err != nil {
			if !s.isClosed() {
				s.log.Error(err, "target server stopped accepting", "addr", ln.Addr().String())
			}
			return
		}
		s.connMu.Lock()
		if s.closed {
			s.connMu.Unlock()
			_ = nc.Close()
			return
		}
		s.conns[nc] = struct{}{}
		s.wg.Add(1)
		s.connMu.Unlock()
		s.accepted.Add(1)
		go s.serve(nc)
	}
}

func (s *TargetServer) serve(nc net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.connMu.Lock()
		delete(s.conns, nc)
		s.connMu.Unlock()
		_ = nc.Close()
	}()
	peer := nc.RemoteAddr().String()
	var hdr [frameHeaderSize]byte
	ack := make([]byte, frameHeaderSize, frameHeaderSize+maxAckMessage)
	for {
		if _, err := io.ReadFull(nc, hdr[:]); err != nil {
			s.connFailed(err, peer, "reading a frame header", true)
			return
		}
		h, err := decodeFrameHeader(hdr[:])
		if err == nil && h.kind != kindWrite {
			err = fmt.Errorf("unexpected frame kind %d from a client", h.kind)
		}
		if err != nil {
			s.badFrames.Add(1)
			s.log.Error(err, "closing target connection on a bad frame", "peer", peer)
			return
		}
		status := int32(statusOK)
		var msg []byte
		if dst, ok := s.lookup(h.arg, h.length); ok {
			if _, err := io.ReadFull(nc, dst); err != nil {
				s.connFailed(err, peer, "reading a payload", false)
				return
			}
			s.writes.Add(1)
			s.bytes.Add(h.length)
		} else {
			if _, err := io.CopyN(io.Discard, nc, int64(h.length)); err != nil {
				s.connFailed(err, peer, "skipping a refused payload", false)
				return
			}
			s.refused.Add(1)
			status = statusOutOfRange
			msg = fmt.Appendf(ack[frameHeaderSize:frameHeaderSize], "dst %#x len %d outside registered memory", h.arg, h.length)
			msg = msg[:min(len(msg), maxAckMessage)]
		}
		frame := append(ack[:frameHeaderSize], msg...)
		ackHeader(h.id, status, len(msg)).encode((*[frameHeaderSize]byte)(frame))
		if err := s.writeAck(nc, frame); err != nil {
			s.connFailed(err, peer, "writing an ack", false)
			return
		}
		if s.afterAck != nil {
			s.afterAck(s.acks.Add(1))
		}
	}
}

func (s *TargetServer) writeAck(nc net.Conn, frame []byte) error {
	if err := nc.SetWriteDeadline(time.Now().Add(s.writeTimeout)); err != nil {
		return err
	}
	_, err := nc.Write(frame)
	return err
}

// connFailed logs why a connection ends, unless the server is closing or the
// client hung up between frames.
func (s *TargetServer) connFailed(err error, peer, doing string, atBoundary bool) {
	if s.isClosed() {
		return
	}
	if atBoundary && errors.Is(err, io.EOF) {
		s.log.V(4).Info("target connection closed by peer", "peer", peer)
		return
	}
	s.log.Error(err, "closing target connection", "peer", peer, "while", doing)
}

func (s *TargetServer) isClosed() bool {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	return s.closed
}

// Stats returns the server's counters.
func (s *TargetServer) Stats() TargetServerStats {
	return TargetServerStats{
		Writes:    s.writes.Load(),
		Bytes:     s.bytes.Load(),
		Refused:   s.refused.Load(),
		BadFrames: s.badFrames.Load(),
		Accepted:  s.accepted.Load(),
	}
}

// Close stops listening, drops every connection without acking the frames in
// progress and waits for the server's goroutines.
func (s *TargetServer) Close() error {
	s.connMu.Lock()
	if s.closed {
		s.connMu.Unlock()
		return nil
	}
	s.closed = true
	var err error
	if s.ln != nil {
		err = s.ln.Close()
	}
	for nc := range s.conns {
		_ = nc.Close()
	}
	s.connMu.Unlock()
	close(s.closing)
	s.wg.Wait()
	return err
}

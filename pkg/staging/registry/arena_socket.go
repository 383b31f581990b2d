// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

// The arena socket: every rank listens on sock-<id> in its group
// directory, and that is where a sender claims one of its lanes: the
// rank's socket goroutine picks the lane, records the owner in its own
// control file and answers with the lane's index and epoch and, by
// SCM_RIGHTS, the claim's sender block, relay block and eventfd and, when
// the arena can hand out its lanes (staging.LaneFDArena), a descriptor of
// that lane's staging memory; nothing else. The connection stays open for
// the lease: its end is the relay's proof that the holder let go.
// A unix socket file, not an abstract one: pods of a group share the
// directory but not a network namespace. See docs/registry.md.
const (
	// sockMaxWaiting bounds the connections waiting for their request,
	// every peer's together, and sockMaxPerPeer those of one peer (by the
	// pid SO_PEERCRED gives). A connection whose request is there when it
	// is accepted is answered at once and never waits.
	sockMaxWaiting = 8
	sockMaxPerPeer = 2
	// sockMaxOpen bounds the connections the server holds at once,
	// waiting or on their way to being closed (a dropped connection
	// closes when its goroutine runs): the accept loop takes no more
	// until one is closed, and the kernel's backlog holds or refuses the
	// rest. A flood of connections costs the relay at most this many
	// descriptors, however late its goroutines run.
	sockMaxOpen = sockMaxWaiting + 4
	// sockRequestTimeout is how long after its accept a connection may
	// take to send its request: a sender writes it right after connect.
	sockRequestTimeout = 100 * time.Millisecond
	// sockAnswerTimeout bounds the write of an answer, which fits the
	// socket's empty send buffer.
	sockAnswerTimeout = 100 * time.Millisecond
	// sockClientTimeout bounds a sender's wait for its answer.
	sockClientTimeout = 2 * time.Second
	// sockBacklog is the listen backlog.
	sockBacklog = 32

	fdMagic = 0x44465850 // "PXFD"
	// fdVersion 3 is a claim (ABI 6); version 2 asked for the staging
	// memory of a lane claimed in the control file, and version 1 for the
	// whole arena; both are refused.
	fdVersion = 3
	// fdRequestSize and fdAnswerSize are fixed: a request is read whole
	// or not at all.
	fdRequestSize = 48
	fdAnswerSize  = 32
	// fdMaxRights is the most descriptors of an answer: sender block,
	// relay block, eventfd and the lane's staging memory.
	fdMaxRights = 4
	// sockPathMax is the room in sockaddr_un for a path and its NUL.
	sockPathMax = 107
)

// Answer statuses.
const (
	fdOK = iota
	fdMalformed
	fdNotHolder
	fdNotReady
	fdExportFailed
	fdWrongUID
	fdNoFreeLane
	fdHeld
	fdLaneRetired
)

func fdStatusText(s uint32) string {
	switch s {
	case fdOK:
		return "ok"
	case fdMalformed:
		return "malformed request"
	case fdNotHolder:
		return "the asker is not the rank it names"
	case fdNotReady:
		return "the relay is not READY"
	case fdExportFailed:
		return "the relay could not export its arena"
	case fdWrongUID:
		return "the asker's uid is not the registry's"
	case fdNoFreeLane:
		return "no free lane"
	case fdHeld:
		return "the asker already holds a lane"
	case fdLaneRetired:
		return "the relay's free lanes are retired: their new staging memory could not be put in place or registered with the NIC"
	}
	return "status " + strconv.FormatUint(uint64(s), 10)
}

// fdRequest claims a lane for the rank it names: its identity and PID
// namespace, which the relay records as the lane's owner.
type fdRequest struct {
	Owner staging.Identity
	NS    staging.PidNS
}

func (q fdRequest) encode() [fdRequestSize]byte {
	var b [fdRequestSize]byte
	binary.LittleEndian.PutUint32(b[0:], fdMagic)
	binary.LittleEndian.PutUint32(b[4:], fdVersion)
	binary.LittleEndian.PutUint64(b[8:], uint64(q.Owner.Pid))
	binary.LittleEndian.PutUint64(b[16:], q.Owner.StartTime)
	binary.LittleEndian.PutUint64(b[24:], q.Owner.Epoch)
	binary.LittleEndian.PutUint64(b[32:], q.NS.Dev)
	binary.LittleEndian.PutUint64(b[40:], q.NS.Ino)
	return b
}

func decodeFDRequest(b []byte) (fdRequest, error) {
	if len(b) != fdRequestSize {
		return fdRequest{}, fmt.Errorf("request of %d bytes, want %d", len(b), fdRequestSize)
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != fdMagic {
		return fdRequest{}, fmt.Errorf("request magic %#x, want %#x", m, fdMagic)
	}
	if v := binary.LittleEndian.Uint32(b[4:]); v != fdVersion {
		return fdRequest{}, fmt.Errorf("request version %d, want %d", v, fdVersion)
	}
	pid := binary.LittleEndian.Uint64(b[8:])
	q := fdRequest{
		Owner: staging.Identity{StartTime: binary.LittleEndian.Uint64(b[16:]), Epoch: binary.LittleEndian.Uint64(b[24:])},
		NS:    staging.PidNS{Dev: binary.LittleEndian.Uint64(b[32:]), Ino: binary.LittleEndian.Uint64(b[40:])},
	}
	switch {
	case pid == 0 || pid > staging.MaxPid:
		return q, fmt.Errorf("pid %d out of range 1..%d", pid, staging.MaxPid)
	case q.Owner.Epoch == 0:
		return q, errors.New("request epoch 0")
	}
	q.Owner.Pid = int(pid)
	return q, nil
}

// fdAnswer is the relay's answer to a claim; with fdOK, Rights
// descriptors come with it: sender block, relay block, eventfd, and the
// lane's staging memory when Rights is 4.
type fdAnswer struct {
	Status    uint32
	Lane      uint32
	Rights    uint32
	LaneEpoch uint64
	LaneBytes uint64
}

func (a fdAnswer) encode() [fdAnswerSize]byte {
	var b [fdAnswerSize]byte
	binary.LittleEndian.PutUint32(b[0:], fdMagic)
	binary.LittleEndian.PutUint32(b[4:], a.Status)
	binary.LittleEndian.PutUint32(b[8:], a.Lane)
	binary.LittleEndian.PutUint32(b[12:], a.Rights)
	binary.LittleEndian.PutUint64(b[16:], a.LaneEpoch)
	binary.LittleEndian.PutUint64(b[24:], a.LaneBytes)
	return b
}

func decodeFDAnswer(b []byte) fdAnswer {
	return fdAnswer{
		Status:    binary.LittleEndian.Uint32(b[4:]),
		Lane:      binary.LittleEndian.Uint32(b[8:]),
		Rights:    binary.LittleEndian.Uint32(b[12:]),
		LaneEpoch: binary.LittleEndian.Uint64(b[16:]),
		LaneBytes: binary.LittleEndian.Uint64(b[24:]),
	}
}

// claimer decides claims for an arena socket (the Rank): claim answers a
// request and, with fdOK, returns the descriptors to send, which the
// server closes after sending, and the lease, which it keeps until the
// connection ends and then hands to release.
type claimer interface {
	claim(cred *unix.Ucred, q fdRequest) (fdAnswer, []int, *inboundClaim)
	release(c *inboundClaim, why string)
	lapse(c *inboundClaim, why string)
}

// leaseRelease is the one byte a holder writes on its lease's connection,
// once it has unmapped the lane, to release it; a connection that ends
// without it lapses (Rank.lapse).
const leaseRelease = 'R'

// sockAddr is the address of name in the directory dirfd refers to: its
// path when short enough, or else the path through /proc/self/fd, which
// resolves to the same directory and fits whatever the root's length.
func sockAddr(dirfd int, dirPath, name string) string {
	if p := filepath.Join(dirPath, name); len(p) <= sockPathMax {
		return p
	}
	return "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + name
}

// ServeStats counts what an arena socket did.
type ServeStats struct {
	// Served: claims answered with their descriptors.
	Served uint64
	// Refused: connections answered with an error (wrong uid, malformed,
	// not the lane's holder, not READY, export failed) or dropped for a
	// missing or late request.
	Refused uint64
	// Busy: connections dropped while waiting for their request, to make
	// room for a newer one of the same peer, or of any peer when
	// sockMaxWaiting were waiting.
	Busy uint64
}

// arenaServer serves one rank's arena socket from goroutines of its own:
// nothing it does waits on the pump or holds the registry lock. A request
// already whole when its connection is accepted is answered by the accept
// loop at once; other connections wait for theirs, at most
// sockRequestTimeout, sockMaxPerPeer of a peer and sockMaxWaiting in all,
// and a newcomer takes the place of the oldest of its own peer's, or of
// the peer with the most. So no client holds more than sockMaxWaiting
// descriptors of the server, and none keeps another's answer from coming.
type arenaServer struct {
	ln     *net.UnixListener
	dirfd  int
	name   string
	uid    int
	claims claimer
	log    klog.Logger

	// waiting are the connections waiting for their request, oldest
	// first; each is its goroutine's, which removes it.
	mu      sync.Mutex
	waiting []*waitingConn
	// leases are the connections of claims answered, each held by a
	// goroutine until it ends.
	leases map[*net.UnixConn]struct{}
	// open holds a token for each accepted connection not yet closed.
	open    chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup
	served  atomic.Uint64
	refused atomic.Uint64
	busy    atomic.Uint64
	once    sync.Once
}

// waitingConn is a connection whose request has not come whole yet: the
// n bytes of it read so far, and the pid of its peer.
type waitingConn struct {
	c       *net.UnixConn
	pid     int32
	buf     [fdRequestSize]byte
	n       int
	dropped bool
}

// startArenaServer binds sock-<id> in d, 0600 whatever the umask (the
// socket's own mode is set before bind, and bind creates the file with
// it), and serves it.
func startArenaServer(d *registryDir, name string, claims claimer, log klog.Logger) (*arenaServer, error) {
	s := &arenaServer{name: name, uid: d.uid, claims: claims, log: log, leases: map[*net.UnixConn]struct{}{}, open: make(chan struct{}, sockMaxOpen), done: make(chan struct{})}
	path := filepath.Join(d.path, name)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, &os.PathError{Op: "socket", Path: path, Err: err}
	}
	if err := unix.Fchmod(fd, folder.FilePerm); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "chmod socket", Path: path, Err: err}
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: sockAddr(d.fd(), d.path, name)}); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "bind", Path: path, Err: err}
	}
	own, err := unix.FcntlInt(uintptr(d.fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.Close(fd)
		unix.Unlinkat(d.fd(), name, 0)
		return nil, &os.PathError{Op: "dup", Path: d.path, Err: err}
	}
	s.dirfd = own
	fail := func(err error) (*arenaServer, error) {
		unix.Close(fd)
		s.unlink()
		unix.Close(own)
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fail(&os.PathError{Op: "stat", Path: path, Err: err})
	}
	if p := folder.PrivateProblem(&st, d.uid, unix.S_IFSOCK); p != "" {
		return fail(&UnsafeError{Path: path, Problem: p})
	}
	if err := unix.Listen(fd, sockBacklog); err != nil {
		return fail(&os.PathError{Op: "listen", Path: path, Err: err})
	}
	f := os.NewFile(uintptr(fd), path)
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		s.unlink()
		unix.Close(own)
		return nil, fmt.Errorf("serve %s: %w", path, err)
	}
	s.ln = ln.(*net.UnixListener)
	s.wg.Add(1)
	go s.run()
	return s, nil
}

func (s *arenaServer) run() {
	defer s.wg.Done()
	backoff := time.NewTimer(0)
	<-backoff.C
	for {
		select {
		case s.open <- struct{}{}:
		case <-s.done:
			return
		}
		c, err := s.ln.AcceptUnix()
		if err != nil {
			<-s.open
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, most likely: wait a little rather than
			// spin, and let the connections being served finish.
			s.log.V(2).Info("pxn arena socket accept failed", "socket", s.name, "err", err.Error())
			backoff.Reset(10 * time.Millisecond)
			select {
			case <-backoff.C:
			case <-s.done:
				return
			}
			continue
		}
		s.take(c)
	}
}

// take deals with a connection just accepted: a peer of another uid is
// refused, a request already whole is answered, and any other connection
// waits for its request in a goroutine of its own.
func (s *arenaServer) take(c *net.UnixConn) {
	cred, err := peerCred(c)
	if err != nil {
		s.refused.Add(1)
		s.closeConn(c)
		return
	}
	if int(cred.Uid) != s.uid {
		s.log.V(2).Info("pxn arena socket refused a peer of another uid", "socket", s.name, "uid", cred.Uid)
		s.reply(c, fdAnswer{Status: fdWrongUID}, nil)
		s.closeConn(c)
		return
	}
	w := &waitingConn{c: c, pid: cred.Pid}
	n, err := readNow(c, w.buf[:])
	if err != nil {
		s.refused.Add(1)
		s.closeConn(c)
		return
	}
	w.n = n
	if n == len(w.buf) {
		s.respond(c, cred, w.buf[:])
		return
	}
	if err := c.SetReadDeadline(time.Now().Add(sockRequestTimeout)); err != nil {
		s.refused.Add(1)
		s.closeConn(c)
		return
	}
	s.admit(w)
	s.wg.Add(1)
	go s.wait(w, cred)
}

// admit adds w to the waiting connections, dropping the oldest of its
// peer's when the peer has sockMaxPerPeer waiting, else the oldest of the
// peer with the most when sockMaxWaiting are.
func (s *arenaServer) admit(w *waitingConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	per := map[int32]int{}
	live := 0
	for _, o := range s.waiting {
		if !o.dropped {
			per[o.pid]++
			live++
		}
	}
	victim := int32(-1)
	switch {
	case per[w.pid] >= sockMaxPerPeer:
		victim = w.pid
	case live >= sockMaxWaiting:
		most := 0
		for pid, k := range per {
			if k > most || k == most && pid < victim {
				victim, most = pid, k
			}
		}
	}
	if victim >= 0 {
		for _, o := range s.waiting {
			if !o.dropped && o.pid == victim {
				o.dropped = true
				s.busy.Add(1)
				o.c.SetReadDeadline(time.Now())
				break
			}
		}
	}
	s.waiting = append(s.waiting, w)
}

// wait reads the rest of w's request, until its deadline or until it is
// dropped, and answers it.
func (s *arenaServer) wait(w *waitingConn, cred *unix.Ucred) {
	defer s.wg.Done()
	_, err := io.ReadFull(w.c, w.buf[w.n:])
	s.mu.Lock()
	s.waiting = slices.DeleteFunc(s.waiting, func(o *waitingConn) bool { return o == w })
	dropped := w.dropped
	s.mu.Unlock()
	switch {
	case err == nil:
		s.respond(w.c, cred, w.buf[:])
		return
	case !dropped:
		s.refused.Add(1)
	}
	s.closeConn(w.c)
}

// closeConn closes an accepted connection and gives back its token.
func (s *arenaServer) closeConn(c *net.UnixConn) {
	c.Close()
	<-s.open
}

// respond answers a whole request and closes the connection, or keeps it
// as the claim's lease.
func (s *arenaServer) respond(c *net.UnixConn, cred *unix.Ucred, req []byte) {
	var ans fdAnswer
	var fds []int
	var lease *inboundClaim
	q, err := decodeFDRequest(req)
	if err != nil {
		s.log.V(2).Info("pxn arena socket refused a request", "socket", s.name, "err", err.Error())
		ans.Status = fdMalformed
	} else {
		ans, fds, lease = s.claims.claim(cred, q)
	}
	sent := s.reply(c, ans, fds)
	for _, fd := range fds {
		unix.Close(fd)
	}
	if lease == nil {
		s.closeConn(c)
		return
	}
	if !sent {
		s.claims.release(lease, "its answer could not be sent")
		s.closeConn(c)
		return
	}
	s.served.Add(1)
	s.mu.Lock()
	closing := s.leases == nil
	if !closing {
		s.leases[c] = struct{}{}
	}
	s.mu.Unlock()
	if closing {
		s.claims.release(lease, "the relay is closing")
		s.closeConn(c)
		return
	}
	// A lease is no connection waiting: it gives its token back.
	<-s.open
	s.wg.Add(1)
	go s.hold(c, lease)
}

// hold keeps a lease's connection until the holder releases the lane or
// the connection ends (the holder's exit ends it, in any namespace), or
// the server closes.
func (s *arenaServer) hold(c *net.UnixConn, lease *inboundClaim) {
	defer s.wg.Done()
	c.SetReadDeadline(time.Time{})
	var b [1]byte
	n, err := c.Read(b[:])
	s.mu.Lock()
	if s.leases != nil {
		delete(s.leases, c)
	}
	s.mu.Unlock()
	switch {
	case n == 1 && b[0] == leaseRelease:
		s.claims.release(lease, "released")
	case n == 1:
		s.claims.lapse(lease, fmt.Sprintf("the holder wrote %#x on its lease", b[0]))
	default:
		s.claims.lapse(lease, fmt.Sprintf("the lease's connection ended: %v", err))
	}
	c.Close()
}

// reply sends the answer, with fds, and reports whether it went out whole.
func (s *arenaServer) reply(c *net.UnixConn, ans fdAnswer, fds []int) bool {
	ans.Rights = uint32(len(fds))
	b := ans.encode()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	err := c.SetWriteDeadline(time.Now().Add(sockAnswerTimeout))
	if err == nil {
		_, _, err = c.WriteMsgUnix(b[:], oob, nil)
	}
	if err != nil || ans.Status != fdOK {
		s.refused.Add(1)
		return false
	}
	return true
}

// readNow reads what has come of the request without waiting: the bytes
// read, or an error when the peer closed or the read failed.
func readNow(c *net.UnixConn, b []byte) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	n := 0
	var rerr error
	err = raw.Read(func(fd uintptr) bool {
		for n < len(b) {
			k, err := unix.Read(int(fd), b[n:])
			switch {
			case errors.Is(err, unix.EINTR):
				continue
			case errors.Is(err, unix.EAGAIN):
				return true
			case err != nil:
				rerr = err
				return true
			case k == 0:
				rerr = io.EOF
				return true
			}
			n += k
		}
		return true
	})
	if err == nil {
		err = rerr
	}
	return n, err
}

// inOwnNS reports whether the asker is a process of the server's PID
// namespace; a pid of 0 (the asker is not visible here) or a process gone
// since says no.
func inOwnNS(cred *unix.Ucred, self staging.PidNS) bool {
	if cred.Pid <= 0 {
		return false
	}
	ns, err := staging.ReadPidNS("/proc/" + strconv.Itoa(int(cred.Pid)) + "/ns/pid")
	return err == nil && ns == self
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

func (s *arenaServer) stats() ServeStats {
	return ServeStats{Served: s.served.Load(), Refused: s.refused.Load(), Busy: s.busy.Load()}
}

func (s *arenaServer) unlink() {
	if err := unix.Unlinkat(s.dirfd, s.name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		s.log.Error(err, "pxn arena socket not removed", "socket", s.name)
	}
}

// close stops accepting, ends the connections waiting for their request
// and the leases, waits for their goroutines and removes the socket file.
func (s *arenaServer) close() error {
	var err error
	s.once.Do(func() {
		close(s.done)
		err = s.ln.Close()
		s.mu.Lock()
		for _, w := range s.waiting {
			w.c.SetReadDeadline(time.Now())
		}
		for c := range s.leases {
			c.SetReadDeadline(time.Now())
		}
		s.leases = nil
		s.mu.Unlock()
		s.wg.Wait()
		s.unlink()
		unix.Close(s.dirfd)
	})
	return err
}

// fdClient is one claim on a relay's arena socket. Nothing in it blocks
// unless asked to: the pump connects, sends and later polls for the
// answer. Once the claim is answered its connection is the lease (take).
type fdClient struct {
	fd       int
	name     string
	deadline int64 // MonoNanos
	buf      [fdAnswerSize]byte
	n        int
	rights   []int
}

// dialArenaSocket connects to the relay's socket name in d and sends q.
// relayPid, when not 0, is the relay's pid in this rank's PID namespace:
// a socket that another process serves in its place is refused.
func dialArenaSocket(d *registryDir, name string, q fdRequest, relayPid int, now int64) (*fdClient, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("arena socket %s: %w", name, err)
	}
	c := &fdClient{fd: fd, name: name, deadline: now + int64(sockClientTimeout)}
	err = unix.Connect(fd, &unix.SockaddrUnix{Name: sockAddr(d.fd(), d.path, name)})
	for errors.Is(err, unix.EINTR) {
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: sockAddr(d.fd(), d.path, name)})
	}
	if err != nil {
		c.close()
		if errors.Is(err, unix.EAGAIN) {
			return nil, fmt.Errorf("arena socket %s: backlog full: %w", name, err)
		}
		return nil, fmt.Errorf("arena socket %s: connect: %w", name, err)
	}
	if relayPid != 0 {
		cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err == nil && int(cred.Pid) != relayPid {
			err = fmt.Errorf("served by pid %d, not the relay's %d", cred.Pid, relayPid)
		}
		if err != nil {
			c.close()
			return nil, fmt.Errorf("arena socket %s: %w", name, err)
		}
	}
	b := q.encode()
	n, err := unix.Write(fd, b[:])
	if err == nil && n != len(b) {
		err = fmt.Errorf("wrote %d of %d bytes", n, len(b))
	}
	if err != nil {
		c.close()
		return nil, fmt.Errorf("arena socket %s: send request: %w", name, err)
	}
	return c, nil
}

// poll reads the answer as far as it has come, waiting up to wait for
// more. done reports an answer read whole (or a failure); then fds are
// the answer's descriptors, which the caller closes.
func (c *fdClient) poll(wait time.Duration) (ans fdAnswer, fds []int, done bool, err error) {
	if wait > 0 {
		pfd := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
		ms := int(wait / time.Millisecond)
		if ms == 0 {
			ms = 1
		}
		if _, err := unix.Poll(pfd, ms); err != nil && !errors.Is(err, unix.EINTR) {
			return ans, nil, true, fmt.Errorf("arena socket %s: poll: %w", c.name, err)
		}
	}
	for c.n < len(c.buf) {
		oob := make([]byte, unix.CmsgSpace(4*fdMaxRights))
		n, oobn, flags, _, err := unix.Recvmsg(c.fd, c.buf[c.n:], oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return ans, nil, false, nil
		case err != nil:
			return ans, nil, true, fmt.Errorf("arena socket %s: receive: %w", c.name, err)
		}
		if oobn > 0 {
			if err := c.takeRights(oob[:oobn]); err != nil {
				return ans, nil, true, err
			}
		}
		if flags&unix.MSG_CTRUNC != 0 {
			return ans, nil, true, fmt.Errorf("arena socket %s: more descriptors than %d", c.name, fdMaxRights)
		}
		if n == 0 {
			return ans, nil, true, fmt.Errorf("arena socket %s: closed after %d bytes of the answer (the relay is busy, closing, or refused us)", c.name, c.n)
		}
		c.n += n
	}
	ans = decodeFDAnswer(c.buf[:])
	switch magic := binary.LittleEndian.Uint32(c.buf[0:]); {
	case magic != fdMagic:
		return ans, nil, true, fmt.Errorf("arena socket %s: answer magic %#x, want %#x", c.name, magic, fdMagic)
	case ans.Status == fdNoFreeLane:
		return ans, nil, true, fmt.Errorf("arena socket %s: claim refused: %w", c.name, ErrNoFreeLane)
	case ans.Status == fdHeld:
		return ans, nil, true, fmt.Errorf("arena socket %s: claim refused: %w", c.name, ErrLaneHeld)
	case ans.Status != fdOK:
		return ans, nil, true, fmt.Errorf("arena socket %s: claim refused: %s", c.name, fdStatusText(ans.Status))
	case ans.Lane >= staging.LaneCount:
		return ans, nil, true, fmt.Errorf("arena socket %s: lane %d out of range 0..%d", c.name, ans.Lane, staging.LaneCount-1)
	case ans.LaneEpoch == 0:
		return ans, nil, true, fmt.Errorf("arena socket %s: lane epoch 0", c.name)
	case ans.Rights != uint32(len(c.rights)) || len(c.rights) < 3:
		return ans, nil, true, fmt.Errorf("arena socket %s: %d descriptors with the answer, which names %d; want 3 or 4", c.name, len(c.rights), ans.Rights)
	}
	fds = c.rights
	c.rights = nil
	return ans, fds, true, nil
}

// takeRights keeps the descriptors of an SCM_RIGHTS message; close closes
// whichever are not handed out.
func (c *fdClient) takeRights(oob []byte) error {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return fmt.Errorf("arena socket %s: control message: %w", c.name, err)
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		c.rights = append(c.rights, fds...)
	}
	return nil
}

// take hands the connection over as the lease of the claim answered.
func (c *fdClient) take() int {
	fd := c.fd
	c.fd = -1
	return fd
}

// close gives up the claim: whatever the relay granted meanwhile is
// released, since nothing of it was mapped (a granted claim's connection
// leaves the client through take before anything is).
func (c *fdClient) close() {
	for _, fd := range c.rights {
		unix.Close(fd)
	}
	c.rights = nil
	if c.fd >= 0 {
		sendRelease(c.fd)
		unix.Close(c.fd)
		c.fd = -1
	}
}

// sendRelease writes the release byte on a lease's connection. A relay
// that already closed its end gets nothing, and raises no SIGPIPE in a
// host process that has no handler for it.
func sendRelease(fd int) {
	b := [1]byte{leaseRelease}
	for {
		err := unix.Sendto(fd, b[:], unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

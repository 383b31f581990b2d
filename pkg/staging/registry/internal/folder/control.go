// SPDX-License-Identifier: Apache-2.0

package folder

import (
	"errors"
	"io/fs"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/staging"
	"golang.org/x/sys/unix"
)

// HeartbeatOffset is where a control file holds its heartbeat.
const HeartbeatOffset = int64(unsafe.Offsetof(staging.Header{}.Heartbeat))

// CtlKind is what a registration's control file says about it.
type CtlKind int

const (
	// CtlNone: neither rank-<id> nor .rank-<id>.tmp exists.
	CtlNone CtlKind = iota
	// CtlValid: a header that validates and names the registration.
	CtlValid
	// CtlBlank: a .tmp file whose header was never written (shorter than a
	// control block, or no magic yet): its rank died or froze between
	// creating the file and writing the header.
	CtlBlank
	// CtlBad: anything else (another ABI, garbage, unsafe): nothing in it
	// can be trusted, not even its namespace.
	CtlBad
)

// Control is the control file of one registration as read once.
type Control struct {
	Kind CtlKind
	Name string
	Hdr  staging.Header
	// Ctime is the file's change time (CLOCK_REALTIME nanoseconds).
	Ctime int64
}

// ReadControl finds and reads the control file of id: rank-<id> while
// it is published, .rank-<id>.tmp before and after. A rank's control file
// is the first of its files to be created and the last to go (see
// Register and Close), so a registration without one has no live process
// behind it unless it is being torn down this very moment.
func ReadControl(dirfd int, dirPath string, uid int, id staging.Identity) Control {
	for _, name := range [...]string{RankFileName(id), TmpFileName(id)} {
		fd, st, err := OpenPrivate(dirfd, dirPath, name, unix.O_RDONLY, uid)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		c := Control{Kind: CtlBad, Name: name, Ctime: st.Ctim.Nano()}
		if err != nil {
			return c
		}
		defer unix.Close(fd)
		tmp := name != RankFileName(id)
		if st.Size < int64(staging.ControlSize) {
			if tmp {
				c.Kind = CtlBlank
			}
			return c
		}
		var buf [HeaderSize]byte
		if PreadFull(fd, buf[:], 0) != nil {
			return c
		}
		h, err := DecodeHeader(buf[:])
		switch {
		case err != nil && tmp && h.Magic == 0:
			c.Kind = CtlBlank
		case err != nil, HeaderIdentity(&h) != id, int(h.UID) != uid:
		default:
			c.Kind, c.Hdr = CtlValid, h
		}
		return c
	}
	return Control{Kind: CtlNone}
}

// HeaderNS is the PID namespace a header names.
func HeaderNS(h *staging.Header) staging.PidNS {
	return staging.PidNS{Dev: h.PidNSDev, Ino: h.PidNSIno}
}

// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/pkg/staging"
)

// fdRequestBytes is a valid claim, bytes changed by set.
func fdRequestBytes(set func(b []byte)) []byte {
	b := fdRequest{Owner: staging.Identity{Pid: 42, StartTime: 0x55, Epoch: 0x1122}, NS: staging.PidNS{Dev: 3, Ino: 0x3344}}.encode()
	if set != nil {
		set(b[:])
	}
	return b[:]
}

func TestDecodeFDRequest(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"valid", fdRequestBytes(nil), ""},
		{"largest pid", fdRequestBytes(func(b []byte) { binary.LittleEndian.PutUint64(b[8:], staging.MaxPid) }), ""},
		{"empty", nil, "request of 0 bytes, want 48"},
		{"short", fdRequestBytes(nil)[:47], "request of 47 bytes, want 48"},
		{"long", append(fdRequestBytes(nil), 0), "request of 49 bytes, want 48"},
		{"magic", fdRequestBytes(func(b []byte) { b[0] ^= 1 }), "request magic 0x44465851, want 0x44465850"},
		{"whole arena", fdRequestBytes(func(b []byte) { binary.LittleEndian.PutUint32(b[4:], 1) }), "request version 1, want 3"},
		{"lane of a claim in the control file", fdRequestBytes(func(b []byte) { binary.LittleEndian.PutUint32(b[4:], 2) }), "request version 2, want 3"},
		{"pid 0", fdRequestBytes(func(b []byte) { clear(b[8:16]) }), "pid 0 out of range"},
		{"pid far out", fdRequestBytes(func(b []byte) { binary.LittleEndian.PutUint64(b[8:], staging.MaxPid+1) }), "out of range"},
		{"sender epoch 0", fdRequestBytes(func(b []byte) { clear(b[24:32]) }), "request epoch 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := decodeFDRequest(tc.b)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("decode: %v", err)
				}
				if back := q.encode(); !bytes.Equal(back[:], tc.b) {
					t.Fatalf("%+v encodes as %x, decoded from %x", q, back, tc.b)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("decode: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// FuzzDecodeFDRequest feeds the arena socket's request decoder what a peer
// could send: it never panics, accepts only claims naming a pid in range
// and a sender epoch, and what it accepts encodes back to the same bytes
// (no field it lets through unread).
func FuzzDecodeFDRequest(f *testing.F) {
	f.Add(fdRequestBytes(nil))
	f.Add(fdRequestBytes(func(b []byte) { clear(b[8:16]) }))
	f.Add(fdRequestBytes(func(b []byte) { b[15] = 0xff }))
	f.Add(fdRequestBytes(func(b []byte) { clear(b[24:]) }))
	f.Add(fdRequestBytes(func(b []byte) { binary.LittleEndian.PutUint32(b[4:], 0) }))
	f.Add(make([]byte, fdRequestSize))
	f.Add([]byte("PXFD"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := decodeFDRequest(b)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("%x: an empty error", b)
			}
			return
		}
		if q.Owner.Pid <= 0 || q.Owner.Pid > staging.MaxPid || q.Owner.Epoch == 0 {
			t.Fatalf("%x: accepted %+v", b, q)
		}
		if back := q.encode(); !bytes.Equal(back[:], b) {
			t.Fatalf("accepted %x as %+v, which encodes as %x", b, q, back)
		}
	})
}

// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/pxn-project/pxn/pkg/staging"
)

// fdRequestBytes is a valid request, bytes changed by set (offset, value
// as little-endian of its width).
func fdRequestBytes(set func(b []byte)) []byte {
	b := fdRequest{Lane: 3, SenderEpoch: 0x1122, LaneEpoch: 0x3344}.encode()
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
		{"last lane", fdRequestBytes(func(b []byte) { binary.LittleEndian.PutUint32(b[8:], staging.LaneCount-1) }), ""},
		{"empty", nil, "request of 0 bytes, want 32"},
		{"short", fdRequestBytes(nil)[:31], "request of 31 bytes, want 32"},
		{"long", append(fdRequestBytes(nil), 0), "request of 33 bytes, want 32"},
		{"magic", fdRequestBytes(func(b []byte) { b[0] ^= 1 }), "request magic 0x44465851, want 0x44465850"},
		{"whole arena", fdRequestBytes(func(b []byte) { binary.LittleEndian.PutUint32(b[4:], 1) }), "request version 1, want 2"},
		{"version", fdRequestBytes(func(b []byte) { binary.LittleEndian.PutUint32(b[4:], 3) }), "request version 3, want 2"},
		{"padding", fdRequestBytes(func(b []byte) { b[15] = 1 }), "request padding"},
		{"lane", fdRequestBytes(func(b []byte) { binary.LittleEndian.PutUint32(b[8:], staging.LaneCount) }), "lane 7 out of range 0..6"},
		{"lane far out", fdRequestBytes(func(b []byte) { binary.LittleEndian.PutUint32(b[8:], 1<<31) }), "lane 2147483648 out of range"},
		{"sender epoch 0", fdRequestBytes(func(b []byte) { clear(b[16:24]) }), "request epoch 0"},
		{"lane epoch 0", fdRequestBytes(func(b []byte) { clear(b[24:32]) }), "request epoch 0"},
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
// could send: it never panics, accepts only requests of a lane in range
// with both epochs set, and what it accepts encodes back to the same bytes
// (no field or padding it lets through unread).
func FuzzDecodeFDRequest(f *testing.F) {
	f.Add(fdRequestBytes(nil))
	f.Add(fdRequestBytes(func(b []byte) { binary.LittleEndian.PutUint32(b[8:], staging.LaneCount) }))
	f.Add(fdRequestBytes(func(b []byte) { b[12] = 0xff }))
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
		if q.Lane >= staging.LaneCount || q.SenderEpoch == 0 || q.LaneEpoch == 0 {
			t.Fatalf("%x: accepted %+v", b, q)
		}
		if back := q.encode(); !bytes.Equal(back[:], b) {
			t.Fatalf("accepted %x as %+v, which encodes as %x", b, q, back)
		}
	})
}

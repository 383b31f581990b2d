// SPDX-License-Identifier: Apache-2.0

package fabric

import (
	"bytes"
	"math"
	"testing"
)

func TestFrameHeaderRoundTrip(t *testing.T) {
	for _, h := range []frameHeader{
		{kind: kindWrite, id: 1, arg: 0x5500_0000_0000, length: 8 << 20},
		{kind: kindWrite, id: math.MaxUint64, arg: math.MaxUint64, length: maxPayload},
		{kind: kindWrite},
		ackHeader(7, statusOK, 0),
		ackHeader(8, statusOutOfRange, maxAckMessage),
		ackHeader(9, math.MinInt32, 1),
	} {
		var b [frameHeaderSize]byte
		h.encode(&b)
		got, err := decodeFrameHeader(b[:])
		if err != nil || got != h {
			t.Errorf("decode(encode(%+v)) = %+v, %v", h, got, err)
		}
	}
	if ackHeader(1, -5, 0).status() != -5 {
		t.Error("negative status lost")
	}
}

func FuzzDecodeFrameHeader(f *testing.F) {
	for _, h := range []frameHeader{
		{kind: kindWrite, id: 1, arg: 0x1000, length: 1},
		{kind: kindWrite, length: maxPayload},
		ackHeader(3, statusOutOfRange, 40),
		ackHeader(4, -1, 0),
	} {
		var b [frameHeaderSize]byte
		h.encode(&b)
		f.Add(b[:])
	}
	f.Add([]byte("PXNW"))
	f.Add(bytes.Repeat([]byte{0xff}, frameHeaderSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeFrameHeader(b)
		if err != nil {
			return
		}
		switch h.kind {
		case kindWrite:
			if h.length > maxPayload {
				t.Fatalf("accepted a write of %d bytes", h.length)
			}
		case kindAck:
			if h.length > maxAckMessage {
				t.Fatalf("accepted an ack message of %d bytes", h.length)
			}
			if back := ackHeader(h.id, h.status(), int(h.length)); back != h {
				t.Fatalf("status %#x does not survive int32", h.arg)
			}
		default:
			t.Fatalf("accepted kind %d", h.kind)
		}
		var out [frameHeaderSize]byte
		h.encode(&out)
		if !bytes.Equal(out[:], b[:frameHeaderSize]) {
			t.Fatalf("re-encoding %x gives %x", b[:frameHeaderSize], out)
		}
	})
}

// SPDX-License-Identifier: Apache-2.0

package fabric

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Wire format of the TCP hop. Every frame is a 32-byte little-endian header
// followed by Length bytes:
//
//	offset size field
//	0      4    magic    0x574e5850 ("PXNW")
//	4      2    version  1
//	6      2    kind     1 = write request (client to target), 2 = ack (target to client)
//	8      8    id       chosen by the client per request, echoed by its ack
//	16     8    arg      write: destination address; ack: status as a sign-extended int32
//	24     8    length   write: payload bytes (≤ maxPayload); ack: message bytes (≤ maxAckMessage)
//
// A target acks every write it reads, in order, with status 0 or a failure
// status and a message. A header that does not decode closes the connection.
const (
	frameMagic      = 0x574e5850
	frameVersion    = 1
	frameHeaderSize = 32

	kindWrite = 1
	kindAck   = 2

	maxPayload    = 64 << 20
	maxAckMessage = 1 << 10

	statusOK         = 0
	statusOutOfRange = 1
)

type frameHeader struct {
	kind   uint16
	id     uint64
	arg    uint64
	length uint64
}

func (h frameHeader) encode(b *[frameHeaderSize]byte) {
	binary.LittleEndian.PutUint32(b[0:], frameMagic)
	binary.LittleEndian.PutUint16(b[4:], frameVersion)
	binary.LittleEndian.PutUint16(b[6:], h.kind)
	binary.LittleEndian.PutUint64(b[8:], h.id)
	binary.LittleEndian.PutUint64(b[16:], h.arg)
	binary.LittleEndian.PutUint64(b[24:], h.length)
}

// status returns an ack's status.
func (h frameHeader) status() int32 { return int32(h.arg) }

func ackHeader(id uint64, status int32, msgLen int) frameHeader {
	return frameHeader{kind: kindAck, id: id, arg: uint64(int64(status)), length: uint64(msgLen)}
}

// decodeFrameHeader parses and checks a frame header. It trusts nothing in b.
func decodeFrameHeader(b []byte) (frameHeader, error) {
	if len(b) < frameHeaderSize {
		return frameHeader{}, fmt.Errorf("frame header of %d bytes, want %d", len(b), frameHeaderSize)
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != frameMagic {
		return frameHeader{}, fmt.Errorf("bad frame magic %#x, want %#x", m, frameMagic)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != frameVersion {
		return frameHeader{}, fmt.Errorf("unsupported frame version %d, want %d", v, frameVersion)
	}
	h := frameHeader{
		kind:   binary.LittleEndian.Uint16(b[6:]),
		id:     binary.LittleEndian.Uint64(b[8:]),
		arg:    binary.LittleEndian.Uint64(b[16:]),
		length: binary.LittleEndian.Uint64(b[24:]),
	}
	switch h.kind {
	case kindWrite:
		if h.length > maxPayload {
			return frameHeader{}, fmt.Errorf("write frame of %d bytes exceeds the limit of %d", h.length, maxPayload)
		}
	case kindAck:
		if s := int64(h.arg); s < math.MinInt32 || s > math.MaxInt32 {
			return frameHeader{}, fmt.Errorf("ack status %#x is not an int32", h.arg)
		}
		if h.length > maxAckMessage {
			return frameHeader{}, fmt.Errorf("ack message of %d bytes exceeds the limit of %d", h.length, maxAckMessage)
		}
	default:
		return frameHeader{}, fmt.Errorf("unknown frame kind %d", h.kind)
	}
	return h, nil
}

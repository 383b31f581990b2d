// SPDX-License-Identifier: Apache-2.0

package gpu_test

import (
	"encoding/binary"
	"errors"
	"os"
	"strconv"
	"testing"

	"github.com/pxn-project/pxn/internal/fakecuda"
	"github.com/pxn-project/pxn/pkg/cuda"
	"github.com/pxn-project/pxn/pkg/gpu"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
)

// FuzzOpenIPCHandle hands a legacy-IPC provider the 64 bytes a peer's
// header holds as its CUDA IPC handle, on the stand-in driver. The handle
// is the driver's to judge; PXN's part is judged here: an empty handle is
// a corrupt entry that never reaches the driver, a handle the driver
// refuses is an ImportError naming cuIpcOpenMemHandle that makes the relay
// unusable, the provider counts each outcome once, and a handle the driver
// takes reaches it whole (the stand-in maps the address its bytes 8..15
// hold).
func FuzzOpenIPCHandle(f *testing.F) {
	lib := os.Getenv(fakecuda.LibEnv)
	if lib == "" {
		lib = fakecuda.Build(f, f.TempDir(), "-O2")
	}
	f.Setenv(fakecuda.VersionEnv, strconv.Itoa(13000))
	d, err := cuda.LoadLibrary(lib)
	if err != nil {
		f.Fatalf("LoadLibrary(%s): %v", lib, err)
	}
	f.Cleanup(d.Close)
	g, err := gpu.Open(d, 0)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { g.Close() })
	p := gpu.NewArenasWith(g, gpu.ArenaOptions{Share: gpu.ShareLegacyIPC})
	var fakeHandle [staging.ArenaHandleSize]byte
	copy(fakeHandle[:], "fakeipc\x00")
	binary.LittleEndian.PutUint64(fakeHandle[8:], 0x7f0000001000)
	f.Add(fakeHandle[:])
	f.Add(fakeHandle[:16])
	f.Add([]byte("fakeipd"))
	f.Add(make([]byte, staging.ArenaHandleSize))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var h [staging.ArenaHandleSize]byte
		copy(h[:], b)
		before := p.Counts()
		pa, err := p.Open(nil, h)
		after := p.Counts()
		if after.FD != before.FD || after.FailedFD != before.FailedFD {
			t.Fatalf("an IPC handle moved the descriptor counts: %+v, then %+v", before, after)
		}
		if err != nil {
			if after.FailedIPC != before.FailedIPC+1 || after.IPC != before.IPC {
				t.Fatalf("handle %x refused (%v): counts %+v, then %+v", h, err, before, after)
			}
			if h == ([staging.ArenaHandleSize]byte{}) {
				if !errors.Is(err, registry.ErrCorruptEntry) {
					t.Fatalf("empty handle: %v, want a corrupt entry", err)
				}
				return
			}
			var ie *gpu.ImportError
			if !errors.As(err, &ie) || ie.Step != "cuIpcOpenMemHandle" || ie.Share != gpu.ShareLegacyIPC || !errors.Is(err, gpu.ErrPeerArenaUnusable) {
				t.Fatalf("handle %x: error %v, want an ImportError of cuIpcOpenMemHandle", h, err)
			}
			return
		}
		defer pa.Close()
		if after.IPC != before.IPC+1 || after.FailedIPC != before.FailedIPC {
			t.Fatalf("handle %x opened: counts %+v, then %+v", h, before, after)
		}
		if want := binary.LittleEndian.Uint64(h[8:]); uint64(pa.Base()) != want {
			t.Fatalf("handle %x opened at %#x, the handle names %#x", h, pa.Base(), want)
		}
	})
}

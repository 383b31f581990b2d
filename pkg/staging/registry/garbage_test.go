// SPDX-License-Identifier: Apache-2.0

package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry/internal/folder"
)

func TestRegistryRefusesUnsafeDirectoriesAndFiles(t *testing.T) {
	const other = 65534
	rankName := folder.RankFileName(staging.Identity{Pid: os.Getpid(), StartTime: 1, Epoch: 1})
	mkdir := func(t *testing.T, dir string, mode os.FileMode) {
		t.Helper()
		if err := os.Mkdir(dir, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
	}
	private := func(t *testing.T, dir string) {
		mkdir(t, dir, 0o700)
		writeFile0600(t, filepath.Join(dir, folder.LockFileName), nil)
	}
	tests := []struct {
		name      string
		needsRoot bool
		setup     func(t *testing.T, root, dir string)
		want      string
	}{
		{name: "directory mode 0755", want: "has mode 0755",
			setup: func(t *testing.T, root, dir string) { mkdir(t, dir, 0o755) }},
		{name: "directory mode 0710", want: "has mode 0710",
			setup: func(t *testing.T, root, dir string) { mkdir(t, dir, 0o710) }},
		{name: "lock file mode 0644", want: "has mode 0644",
			setup: func(t *testing.T, root, dir string) {
				mkdir(t, dir, 0o700)
				writeFile0600(t, filepath.Join(dir, folder.LockFileName), nil)
				os.Chmod(filepath.Join(dir, folder.LockFileName), 0o644)
			}},
		{name: "control file mode 0644", want: "has mode 0644",
			setup: func(t *testing.T, root, dir string) {
				private(t, dir)
				writeFile0600(t, filepath.Join(dir, rankName), nil)
				os.Chmod(filepath.Join(dir, rankName), 0o644)
			}},
		{name: "directory is a symlink", want: "is a symlink",
			setup: func(t *testing.T, root, dir string) {
				mkdir(t, filepath.Join(root, "elsewhere"), 0o700)
				if err := os.Symlink("elsewhere", dir); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "lock file is a symlink", want: "is a symlink",
			setup: func(t *testing.T, root, dir string) {
				mkdir(t, dir, 0o700)
				writeFile0600(t, filepath.Join(root, "target"), nil)
				if err := os.Symlink(filepath.Join(root, "target"), filepath.Join(dir, folder.LockFileName)); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "control file is a symlink", want: "is a symlink",
			setup: func(t *testing.T, root, dir string) {
				private(t, dir)
				writeFile0600(t, filepath.Join(root, "target"), nil)
				if err := os.Symlink(filepath.Join(root, "target"), filepath.Join(dir, rankName)); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "lock file is a directory", want: "is not a regular file",
			setup: func(t *testing.T, root, dir string) {
				mkdir(t, dir, 0o700)
				mkdir(t, filepath.Join(dir, folder.LockFileName), 0o700)
			}},
		{name: "directory is a file", want: "is not a directory",
			setup: func(t *testing.T, root, dir string) { writeFile0600(t, dir, nil) }},
		{name: "directory of another uid", needsRoot: true, want: fmt.Sprintf("owned by uid %d, not 0", other),
			setup: func(t *testing.T, root, dir string) {
				mkdir(t, dir, 0o700)
				if err := os.Chown(dir, other, other); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "lock file of another uid", needsRoot: true, want: fmt.Sprintf("owned by uid %d, not 0", other),
			setup: func(t *testing.T, root, dir string) {
				private(t, dir)
				if err := os.Chown(filepath.Join(dir, folder.LockFileName), other, other); err != nil {
					t.Fatal(err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.needsRoot && os.Geteuid() != 0 {
				t.Skip("needs root to chown")
			}
			root := regTestRoot(t)
			dir := groupDir(root, "g")
			tt.setup(t, root, dir)
			before := listDir(t, dir)
			aside := listDir(t, filepath.Join(root, "elsewhere"))
			r, err := Register(context.Background(), regOptions(root, "g", "rail0"))
			var ue *folder.UnsafeError
			if r != nil || !errors.As(err, &ue) || !strings.Contains(ue.Problem, tt.want) || !strings.Contains(err.Error(), "PXN off") {
				t.Fatalf("Register = %v, %v; want an folder.UnsafeError saying %q", r, err, tt.want)
			}
			if after := listDir(t, dir); !slices.Equal(after, before) {
				t.Errorf("a refused registry changed from %v to %v", before, after)
			}
			if after := listDir(t, filepath.Join(root, "elsewhere")); !slices.Equal(after, aside) {
				t.Errorf("something was written through the symlink: %v", after)
			}
		})
	}
}

func TestRegistryUnsafeEntryTurnsPXNOff(t *testing.T) {
	root := regTestRoot(t)
	r := mustRegister(t, regOptions(root, "g", "rail0"))
	relay := mustRegister(t, regOptions(root, "g", "rail1"))
	peer := peerByName(t, r, relay.Name())
	stray := filepath.Join(r.Dir(), "stray")
	writeFile0600(t, stray, nil)
	os.Chmod(stray, 0o666)
	_, err := r.Peers(context.Background())
	var ue *folder.UnsafeError
	if !errors.As(err, &ue) || ue.Path != stray {
		t.Fatalf("Peers = %v, want an folder.UnsafeError about %s", err, stray)
	}
	if !errors.As(r.Off(), &ue) {
		t.Errorf("Off = %v, want the folder.UnsafeError", r.Off())
	}
	if _, err := r.Attach(context.Background(), peer); !errors.As(err, &ue) {
		t.Errorf("Attach after PXN went off = %v, want the folder.UnsafeError", err)
	}
	os.Remove(stray)
	if _, err := r.Peers(context.Background()); !errors.As(err, &ue) {
		t.Errorf("Peers = %v; PXN stays off once off", err)
	}
}

func TestRegistryGarbageControlFilesAreRefused(t *testing.T) {
	ctx := context.Background()
	root := regTestRoot(t)
	r := mustRegister(t, regOptions(root, "g", "rail0"))
	dir := r.Dir()
	me, start := os.Getpid(), selfStart(t)
	valid := func(id staging.Identity) []byte {
		h := folder.NewHeader(id, staging.PidNS{Dev: 1, Ino: 2}, os.Geteuid(), "rail-x", "hca-x", staging.ArenaHost)
		h.State, h.Heartbeat = staging.StateReady, uint64(staging.MonoNanos())
		b := make([]byte, staging.ControlSize)
		copy(b, unsafe.Slice((*byte)(unsafe.Pointer(&h)), folder.HeaderSize))
		return b
	}
	mutated := func(f func(h *staging.Header)) func(id staging.Identity) []byte {
		return func(id staging.Identity) []byte {
			b := valid(id)
			f((*staging.Header)(unsafe.Pointer(&b[0])))
			return b
		}
	}
	// A control file of version 5: the header of then (the wake word at
	// 320, where version 6 has padding), then the counters and seven lanes
	// of 1187904 bytes, all in the file.
	v5 := func(id staging.Identity) []byte {
		b := make([]byte, folder.LegacyControlSize)
		copy(b, valid(id)[:folder.HeaderSize])
		(*staging.Header)(unsafe.Pointer(&b[0])).ABIVersion = 5
		return b
	}
	tests := []struct {
		name  string
		bytes func(id staging.Identity) []byte
		want  string
	}{
		{"empty", func(staging.Identity) []byte { return nil }, "is 0 bytes"},
		{"truncated header", func(id staging.Identity) []byte { return valid(id)[:100] }, "is 100 bytes"},
		{"one byte short", func(id staging.Identity) []byte { return valid(id)[:staging.ControlSize-1] }, fmt.Sprintf("is %d bytes", staging.ControlSize-1)},
		{"zeros", func(staging.Identity) []byte { return make([]byte, staging.ControlSize) }, "magic 0x0 differs from ours 0x31304745524e5850"},
		{"ABI version 1, before the wake word", mutated(func(h *staging.Header) { h.ABIVersion = 1; h.HeaderSize = 320 }), "ABI version 1 differs from ours 6"},
		{"ABI version 2, before PID namespaces and counters", mutated(func(h *staging.Header) { h.ABIVersion = 2; h.HeaderSize = 384 }), "ABI version 2 differs from ours 6"},
		{"ABI version 3, before a Piece's parts", mutated(func(h *staging.Header) { h.ABIVersion = 3 }), "ABI version 3 differs from ours 6"},
		{"ABI version 4, before the lane's open word", mutated(func(h *staging.Header) { h.ABIVersion = 4 }), "ABI version 4 differs from ours 6"},
		{"ABI version 5, lane words in the control file", v5, "ABI version 5 differs from ours 6"},
		{"newer ABI version", mutated(func(h *staging.Header) { h.ABIVersion = 7 }), "ABI version 7 differs from ours 6"},
		{"header size", mutated(func(h *staging.Header) { h.HeaderSize = 384 }), "header size 384 differs from ours 448"},
		{"no PID namespace", mutated(func(h *staging.Header) { h.PidNSIno = 0 }), "no PID namespace"},
		{"no way to map the arena", mutated(func(h *staging.Header) { h.ArenaShares = 0 }), "arena shares 0x0"},
		{"unknown arena share", mutated(func(h *staging.Header) { h.ArenaShares |= 8 }), "arena shares 0x9"},
		{"lane count", mutated(func(h *staging.Header) { h.LaneCount = 8 }), "lane count 8 differs from ours 7"},
		{"slots per lane", mutated(func(h *staging.Header) { h.SlotsPerLane = 16 }), "slots per lane 16 differs from ours 18"},
		{"slot size", mutated(func(h *staging.Header) { h.SlotSize = 4 << 20 }), "slot size 4194304 differs from ours 8388608"},
		{"arena size", mutated(func(h *staging.Header) { h.ArenaSize = 1 << 30 }), "arena size 1073741824 differs from ours 1056964608"},
		{"state", mutated(func(h *staging.Header) { h.State = 9 }), "state 9"},
		{"pid 0", mutated(func(h *staging.Header) { h.Pid = 0 }), "pid 0"},
		{"huge pid", mutated(func(h *staging.Header) { h.Pid = 1 << 40 }), "pid 1099511627776"},
		{"epoch 0", mutated(func(h *staging.Header) { h.BootEpoch = 0 }), "epoch 0"},
		{"header names another rank", mutated(func(h *staging.Header) { h.BootEpoch = 1 }), "header names"},
		{"rail length", mutated(func(h *staging.Header) { h.RailLen = 200 }), "rail length 200"},
		{"HCA length", mutated(func(h *staging.Header) { h.HCALen = 57 }), "HCA length 57"},
		{"NUL in rail", mutated(func(h *staging.Header) { h.Rail[2] = 0 }), "NUL byte"},
		{"arena kind", mutated(func(h *staging.Header) { h.ArenaKind = 7 }), "arena kind 7"},
		{"CUDA arena to a host rank", mutated(func(h *staging.Header) { h.ArenaKind = staging.ArenaCUDA }), "arena kind 2 differs from ours 1"},
		{"uid", mutated(func(h *staging.Header) { h.UID++ }), "header uid"},
	}
	ids := make(map[string]staging.Identity)
	for i, tt := range tests {
		id := staging.Identity{Pid: me, StartTime: start, Epoch: 0x3000 + uint64(i)}
		ids[tt.name] = id
		writeFile0600(t, filepath.Join(dir, folder.RankFileName(id)), tt.bytes(id))
	}
	writeFile0600(t, filepath.Join(dir, "rank-not-a-rank"), []byte("junk"))
	writeFile0600(t, filepath.Join(dir, "notes"), []byte("junk"))

	ps, err := r.Peers(ctx)
	if err != nil {
		t.Fatalf("Peers = %v; garbage must not turn PXN off", err)
	}
	byName := make(map[string]PeerInfo)
	for _, p := range ps {
		byName[p.Name] = p
	}
	if len(ps) != len(tests) {
		t.Errorf("Peers listed %d entries, want the %d garbage ones, refused", len(ps), len(tests))
	}
	for _, tt := range tests {
		id := ids[tt.name]
		p, ok := byName[folder.RankFileName(id)]
		if !ok || p.Refused == nil || !strings.Contains(p.Refused.Error(), tt.want) {
			t.Errorf("%s: listed %v, refused %v; want refused with %q", tt.name, ok, p.Refused, tt.want)
		}
		if _, err := r.Attach(ctx, p); err == nil {
			t.Errorf("%s: Attach succeeded", tt.name)
		}
		// Attach re-reads the file itself: even told the peer is fine, it
		// refuses without touching memory past the end of the file.
		if _, err := r.Attach(ctx, PeerInfo{Name: p.Name, Identity: id}); err == nil || !strings.Contains(err.Error(), tt.want) && tt.name != "header names another rank" && tt.name != "uid" {
			t.Errorf("%s: Attach by identity = %v, want refused with %q", tt.name, err, tt.want)
		}
	}
	if r.Off() != nil {
		t.Errorf("Off = %v; garbage must not turn PXN off", r.Off())
	}
}

func validHeaderBytes() []byte {
	h := folder.NewHeader(staging.Identity{Pid: 77, StartTime: 5, Epoch: 9}, staging.PidNS{Dev: 1, Ino: 2}, 0, "r", "h", staging.ArenaHost)
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&h)), folder.HeaderSize)...)
}

func FuzzDecodeHeader(f *testing.F) {
	f.Add(validHeaderBytes())
	f.Add(make([]byte, folder.HeaderSize))
	f.Add([]byte("PXNREG01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := folder.DecodeHeader(b)
		if err != nil {
			return
		}
		if h.Magic != staging.RegistryMagic || h.LaneCount != staging.LaneCount || h.Pid == 0 || h.Pid > staging.MaxPid || h.BootEpoch == 0 {
			t.Fatalf("accepted header %+v", h)
		}
		if int(h.RailLen) > len(h.Rail) || int(h.HCALen) > len(h.HCA) || h.RailLen == 0 {
			t.Fatalf("accepted name lengths %d, %d", h.RailLen, h.HCALen)
		}
		_ = folder.HeaderRail(&h) + folder.HeaderHCA(&h)
	})
}

func FuzzParseEntryName(f *testing.F) {
	for _, s := range []string{"rank-1-2-0000000000000003", ".rank-1-2-0000000000000003.tmp", "arena-1-2-0000000000000003", ".lock", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		kind, id := folder.ParseEntryName(name)
		var back string
		switch kind {
		case folder.EntryRank:
			back = folder.RankFileName(id)
		case folder.EntryTmp:
			back = folder.TmpFileName(id)
		case folder.EntryArena:
			back = folder.ArenaFileName(id)
		default:
			return
		}
		if back != name {
			t.Fatalf("%q parsed as %v, which names %q", name, id, back)
		}
	})
}

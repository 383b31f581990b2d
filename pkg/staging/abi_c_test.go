// SPDX-License-Identifier: Apache-2.0

package staging

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unsafe"

	"github.com/pxn-project/pxn/internal/testtools"
)

var updateABIDoc = flag.Bool("update-abi-doc", false, "rewrite the generated layout section of docs/abi.md")

const (
	headerPath = "../../include/pxn_abi.h"
	abiDocPath = "../../docs/abi.md"
)

// cField is one field of a shared struct as Go lays it out, named as the C
// header names it.
type cField struct {
	goName, cName string
	offset, size  uintptr
	elem          string // C type of the field or of its elements
	count         int    // array length, 0 for a scalar or struct
}

type cStruct struct {
	goName, cName string
	size          uintptr
	fields        []cField
}

// cSnake spells a Go identifier the way the C header does: CommitSeq is
// commit_seq, ABIVersion abi_version, HCALen hca_len.
func cSnake(s string) string {
	r := []rune(s)
	var b strings.Builder
	for i, c := range r {
		if unicode.IsUpper(c) {
			if i > 0 && (unicode.IsLower(r[i-1]) || i+1 < len(r) && unicode.IsLower(r[i+1])) {
				b.WriteByte('_')
			}
			c = unicode.ToLower(c)
		}
		b.WriteRune(c)
	}
	return b.String()
}

func cTypeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Uint64:
		return "uint64_t"
	case reflect.Uint32:
		return "uint32_t"
	case reflect.Int32:
		return "int32_t"
	case reflect.Uint8:
		return "uint8_t"
	case reflect.Struct:
		return "pxn_" + cSnake(t.Name())
	}
	panic(fmt.Sprintf("no C type for %v", t))
}

// goLayout describes every shared struct from Go's own layout. Blank Go
// fields are the C header's pad0, pad1, ... in order.
func goLayout() []cStruct {
	var out []cStruct
	for _, typ := range sharedTypes {
		s := cStruct{goName: typ.Name(), cName: cTypeName(typ), size: typ.Size()}
		pads := 0
		for i := range typ.NumField() {
			f := typ.Field(i)
			cf := cField{goName: f.Name, cName: cSnake(f.Name), offset: f.Offset, size: f.Type.Size()}
			if f.Type.Kind() == reflect.Array {
				cf.elem, cf.count = cTypeName(f.Type.Elem()), f.Type.Len()
			} else {
				cf.elem = cTypeName(f.Type)
			}
			if f.Name == "_" {
				cf.cName = fmt.Sprintf("pad%d", pads)
				pads++
			}
			s.fields = append(s.fields, cf)
		}
		out = append(out, s)
	}
	return out
}

type cMacro struct {
	name  string
	value int64
}

// goMacros are the header's value macros with the Go constants they mirror.
var goMacros = []cMacro{
	{"PXN_ABI_VERSION", ABIVersion},
	{"PXN_LANE_COUNT", LaneCount},
	{"PXN_SLOTS_PER_LANE", SlotsPerLane},
	{"PXN_SLOT_SIZE", SlotSize},
	{"PXN_LANE_BYTES", LaneBytes},
	{"PXN_ARENA_SIZE", ArenaSize},
	{"PXN_MAX_PLANS", MaxPlans},
	{"PXN_MAX_SESSION", MaxSession},
	{"PXN_MAX_PARTS", MaxParts},
	{"PXN_CACHE_LINE", CacheLine},
	{"PXN_REGISTRY_MAGIC", RegistryMagic},
	{"PXN_STATE_INIT", StateInit},
	{"PXN_STATE_READY", StateReady},
	{"PXN_STATE_CLOSING", StateClosing},
	{"PXN_SHARE_IPC_HANDLE", ShareIPCHandle},
	{"PXN_SHARE_FD", ShareFD},
	{"PXN_SHARE_LANE_FD", ShareLaneFD},
	{"PXN_ARENA_HOST", ArenaHost},
	{"PXN_ARENA_CUDA", ArenaCUDA},
	{"PXN_COMPLETION_OK", CompletionOK},
	{"PXN_COMPLETION_INVALID_DESC", CompletionInvalidDesc},
	{"PXN_COMPLETION_SECOND_HOP", CompletionSecondHop},
	{"PXN_COMPLETION_UNRESOLVED", CompletionUnresolved},
	{"PXN_COMPLETION_RELAY_CLOSING", CompletionRelayClosing},
	{"PXN_COMPLETION_TIMEOUT", CompletionTimeout},
	{"PXN_FALLBACK_CREDIT_TIMEOUT", FallbackCreditTimeout},
	{"PXN_FALLBACK_RELAY_STALE", FallbackRelayStale},
	{"PXN_FALLBACK_RELAY_GONE", FallbackRelayGone},
	{"PXN_FALLBACK_LANE_BROKEN", FallbackLaneBroken},
	{"PXN_FALLBACK_SOURCE_EVENT", FallbackSourceEvent},
	{"PXN_FALLBACK_NO_LANE", FallbackNoLane},
	{"PXN_FALLBACK_OTHER", FallbackOther},
	{"PXN_FALLBACK_REASONS", FallbackReasons},
}

// slotProbes are the seqs whose PXN_SLOT_OF the C program prints.
var slotProbes = []uint64{1, 2, 3, 17, 18, 19, 20, 36, 37, 1000, MaxLaneSeq, math.MaxUint64}

// cProgram returns a C11/C++17 program that includes pxn_abi.h, asserts at
// compile time that every size, offset, field type and macro equals layout
// and goMacros, and prints them in the form of cProgramOutput.
func cProgram(layout []cStruct) string {
	var b strings.Builder
	b.WriteString(`#include <stdio.h>
#include "pxn_abi.h"

#ifdef __cplusplus
#include <type_traits>
#define GO_TYPE_IS(expr, T) std::is_same<std::remove_cv<std::remove_reference<decltype(expr)>::type>::type, T>::value
#else
#define GO_TYPE_IS(expr, T) _Generic((expr), T: 1, default: 0)
#endif

`)
	for _, s := range layout {
		fmt.Fprintf(&b, "PXN_STATIC_ASSERT(sizeof(%s) == %d, \"go: sizeof %s\");\n", s.cName, s.size, s.cName)
		for _, f := range s.fields {
			member := fmt.Sprintf("((%s *)0)->%s", s.cName, f.cName)
			elem := member
			if f.count > 0 {
				elem += "[0]"
			}
			fmt.Fprintf(&b, "PXN_STATIC_ASSERT(offsetof(%s, %s) == %d, \"go: offset of %s.%s\");\n", s.cName, f.cName, f.offset, s.cName, f.cName)
			fmt.Fprintf(&b, "PXN_STATIC_ASSERT(sizeof(%s) == %d, \"go: size of %s.%s\");\n", member, f.size, s.cName, f.cName)
			fmt.Fprintf(&b, "PXN_STATIC_ASSERT(GO_TYPE_IS(%s, %s), \"go: type of %s.%s\");\n", elem, f.elem, s.cName, f.cName)
		}
	}
	for _, m := range goMacros {
		fmt.Fprintf(&b, "PXN_STATIC_ASSERT((long long)(%s) == %dLL, \"go: value of %s\");\n", m.name, m.value, m.name)
	}
	b.WriteString("\nint main(void)\n{\n")
	for _, s := range layout {
		fmt.Fprintf(&b, "\tprintf(\"size %s %%zu\\n\", sizeof(%s));\n", s.cName, s.cName)
		for _, f := range s.fields {
			fmt.Fprintf(&b, "\tprintf(\"field %s.%s %%zu %%zu\\n\", offsetof(%s, %s), sizeof(((%s *)0)->%s));\n",
				s.cName, f.cName, s.cName, f.cName, s.cName, f.cName)
		}
	}
	for _, m := range goMacros {
		fmt.Fprintf(&b, "\tprintf(\"macro %s %%lld\\n\", (long long)(%s));\n", m.name, m.name)
	}
	for _, seq := range slotProbes {
		fmt.Fprintf(&b, "\tprintf(\"slot %d %%llu\\n\", (unsigned long long)PXN_SLOT_OF(UINT64_C(%d)));\n", seq, seq)
	}
	b.WriteString("\treturn 0;\n}\n")
	return b.String()
}

// cProgramOutput is what cProgram prints when C agrees with Go.
func cProgramOutput(layout []cStruct) string {
	var b strings.Builder
	for _, s := range layout {
		fmt.Fprintf(&b, "size %s %d\n", s.cName, s.size)
		for _, f := range s.fields {
			fmt.Fprintf(&b, "field %s.%s %d %d\n", s.cName, f.cName, f.offset, f.size)
		}
	}
	for _, m := range goMacros {
		fmt.Fprintf(&b, "macro %s %d\n", m.name, m.value)
	}
	for _, seq := range slotProbes {
		fmt.Fprintf(&b, "slot %d %d\n", seq, SlotOf(seq))
	}
	return b.String()
}

type cCompiler struct {
	name string
	args []string
}

var cCompilers = []cCompiler{
	{"gcc", []string{"-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"}},
	{"g++", []string{"-x", "c++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-pedantic"}},
}

// compileC compiles src against the pxn_abi.h found in includeDir and
// returns the binary's path, or the compiler's output when it fails.
func compileC(t *testing.T, cc cCompiler, includeDir, src string) (bin string, diag string, ok bool) {
	t.Helper()
	if _, err := exec.LookPath(cc.name); err != nil {
		testtools.Missing(t, "%s not installed: %v", cc.name, err)
	}
	dir := t.TempDir()
	srcPath := filepath.Join(dir, "abi_check.c")
	if err := os.WriteFile(srcPath, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(dir, "abi_check")
	args := append(slices.Clone(cc.args), "-I", includeDir, "-o", bin, srcPath)
	out, err := exec.Command(cc.name, args...).CombinedOutput()
	if err != nil {
		return "", string(out), false
	}
	return bin, string(out), true
}

func realIncludeDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Dir(headerPath))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestCHeaderMatchesGo(t *testing.T) {
	layout := goLayout()
	src, want := cProgram(layout), cProgramOutput(layout)
	for _, cc := range cCompilers {
		t.Run(cc.name, func(t *testing.T) {
			bin, diag, ok := compileC(t, cc, realIncludeDir(t), src)
			if !ok {
				t.Fatalf("%s rejects pxn_abi.h against Go's layout:\n%s", cc.name, diag)
			}
			out, err := exec.Command(bin).Output()
			if err != nil {
				t.Fatalf("running the %s-built check: %v", cc.name, err)
			}
			if got := string(out); got != want {
				gotLines, wantLines := strings.Split(got, "\n"), strings.Split(want, "\n")
				for i := range min(len(gotLines), len(wantLines)) {
					if gotLines[i] != wantLines[i] {
						t.Fatalf("%s line %d: C prints %q, Go says %q", cc.name, i+1, gotLines[i], wantLines[i])
					}
				}
				t.Fatalf("%s prints %d lines, Go expects %d", cc.name, len(gotLines), len(wantLines))
			}
		})
	}
}

// mutateHeader returns the header with old replaced by new exactly once.
func mutateHeader(t *testing.T, header, old, new string) string {
	t.Helper()
	if n := strings.Count(header, old); n != 1 {
		t.Fatalf("pxn_abi.h holds %q %d times, want once: update the mutation", old, n)
	}
	return strings.Replace(header, old, new, 1)
}

// withoutHeaderAsserts drops the header's own static asserts, so that only
// the generated program can catch a drift.
func withoutHeaderAsserts(header string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(header, "\n") {
		if !strings.HasPrefix(line, "PXN_STATIC_ASSERT(") {
			b.WriteString(line)
		}
	}
	return b.String()
}

func TestCHeaderDriftFailsTheBuild(t *testing.T) {
	raw, err := os.ReadFile(headerPath)
	if err != nil {
		t.Fatal(err)
	}
	header := string(raw)
	movedC := mutateHeader(t, header, "\tuint32_t plan_count;\n", "\tuint64_t plan_count;\n")

	goMoved := goLayout()
	if desc := goMoved[1]; desc.cName != "pxn_desc" || desc.fields[4].cName != "session_len" {
		t.Fatalf("goLayout()[1].fields[4] is %s.%s, want pxn_desc.session_len: update the mutation", desc.cName, desc.fields[4].cName)
	}
	goMoved[1].fields[4].offset += 8

	tests := []struct {
		name     string
		header   string
		layout   []cStruct
		wantFail string
	}{
		{"unchanged header without its own asserts", withoutHeaderAsserts(header), goLayout(), ""},
		{"C field moved", movedC, goLayout(), "pxn_desc.session_len"},
		{"C field moved, only the generated asserts", withoutHeaderAsserts(movedC), goLayout(), "go: offset of pxn_desc.session_len"},
		{"Go field moved", header, goMoved, "go: offset of pxn_desc.session_len"},
		{"C array shrunk", mutateHeader(t, header, "\tuint8_t hca[56];\n", "\tuint8_t hca[48];\n"), goLayout(), "pxn_header.ipc_handle"},
		{"C signedness changed", withoutHeaderAsserts(mutateHeader(t, header, "\tint32_t status;\n", "\tuint32_t status;\n")), goLayout(), "go: type of pxn_completion.status"},
		{"C macro changed", mutateHeader(t, header, "#define PXN_MAX_PLANS 4096\n", "#define PXN_MAX_PLANS 4095\n"), goLayout(), "go: value of PXN_MAX_PLANS"},
	}
	cc := cCompilers[0]
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "pxn_abi.h"), []byte(tt.header), 0o600); err != nil {
				t.Fatal(err)
			}
			_, diag, ok := compileC(t, cc, dir, cProgram(tt.layout))
			switch {
			case tt.wantFail == "" && !ok:
				t.Fatalf("%s rejects it:\n%s", cc.name, diag)
			case tt.wantFail != "" && ok:
				t.Fatalf("%s accepts it; the drift would go unnoticed", cc.name)
			case tt.wantFail != "" && !strings.Contains(diag, tt.wantFail):
				t.Fatalf("%s fails without naming %q:\n%s", cc.name, tt.wantFail, diag)
			}
		})
	}
}

// TestCHeaderAssertsEveryField reads the header's own static asserts: every
// struct size and every field offset must be asserted, with Go's value.
func TestCHeaderAssertsEveryField(t *testing.T) {
	raw, err := os.ReadFile(headerPath)
	if err != nil {
		t.Fatal(err)
	}
	asserted := map[string]string{}
	re := regexp.MustCompile(`(?m)^PXN_STATIC_ASSERT\((offsetof\((\w+), (\w+)\)|sizeof\((\w+)\)) == (\d+),`)
	for _, m := range re.FindAllStringSubmatch(string(raw), -1) {
		key := "sizeof " + m[4]
		if m[2] != "" {
			key = m[2] + "." + m[3]
		}
		if _, dup := asserted[key]; dup {
			t.Errorf("pxn_abi.h asserts %s twice", key)
		}
		asserted[key] = m[5]
	}
	want := map[string]string{}
	for _, s := range goLayout() {
		want["sizeof "+s.cName] = fmt.Sprint(s.size)
		for _, f := range s.fields {
			want[s.cName+"."+f.cName] = fmt.Sprint(f.offset)
		}
	}
	for key, v := range want {
		if got, ok := asserted[key]; !ok {
			t.Errorf("pxn_abi.h does not assert %s (Go: %s)", key, v)
		} else if got != v {
			t.Errorf("pxn_abi.h asserts %s == %s, Go says %s", key, got, v)
		}
	}
	for key := range asserted {
		if _, ok := want[key]; !ok {
			t.Errorf("pxn_abi.h asserts %s, which Go does not have", key)
		}
	}
}

func TestCHeaderMacrosAreAllChecked(t *testing.T) {
	raw, err := os.ReadFile(headerPath)
	if err != nil {
		t.Fatal(err)
	}
	notValues := map[string]bool{"PXN_ABI_H": true, "PXN_STATIC_ASSERT": true, "PXN_SLOT_OF": true}
	checked := map[string]bool{}
	for _, m := range goMacros {
		checked[m.name] = true
	}
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#define (PXN_\w+)`).FindAllStringSubmatch(string(raw), -1) {
		defined[m[1]] = true
		if !notValues[m[1]] && !checked[m[1]] {
			t.Errorf("pxn_abi.h defines %s, which no test compares with Go", m[1])
		}
	}
	for name := range checked {
		if !defined[name] {
			t.Errorf("pxn_abi.h lacks %s", name)
		}
	}
	if !defined["PXN_SLOT_OF"] {
		t.Errorf("pxn_abi.h lacks PXN_SLOT_OF")
	}
}

// TestABIStructsAllMirrored fails when abi.go gains a struct that the C
// header and these tests do not know.
func TestABIStructsAllMirrored(t *testing.T) {
	file, err := parser.ParseFile(token.NewFileSet(), "abi.go", nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var inGo []string
	ast.Inspect(file, func(n ast.Node) bool {
		if ts, ok := n.(*ast.TypeSpec); ok {
			if _, ok := ts.Type.(*ast.StructType); ok {
				inGo = append(inGo, ts.Name.Name)
			}
		}
		return true
	})
	var mirrored []string
	for _, typ := range sharedTypes {
		mirrored = append(mirrored, typ.Name())
	}
	slices.Sort(inGo)
	slices.Sort(mirrored)
	if !slices.Equal(inGo, mirrored) {
		t.Errorf("abi.go declares structs %v, the C mirror checks %v", inGo, mirrored)
	}
}

const (
	docBegin = "<!-- layout: generated by TestABIDocLayout; go test ./pkg/staging -run TestABIDocLayout -update-abi-doc -->\n"
	docEnd   = "<!-- end of generated layout -->\n"
)

// abiDocLayout renders the layout tables of docs/abi.md from Go's layout.
func abiDocLayout() string {
	var b strings.Builder
	for _, s := range goLayout() {
		fmt.Fprintf(&b, "\n### `%s` (Go `%s`), %d bytes\n\n", s.cName, s.goName, s.size)
		b.WriteString("| offset | size | C field | Go field | C type |\n|---:|---:|---|---|---|\n")
		for _, f := range s.fields {
			typ := f.elem
			if f.count > 0 {
				typ = fmt.Sprintf("%s[%d]", f.elem, f.count)
			}
			goName := f.goName
			if goName == "_" {
				goName = "_ (padding)"
			}
			fmt.Fprintf(&b, "| %d | %d | `%s` | `%s` | `%s` |\n", f.offset, f.size, f.cName, goName, typ)
		}
	}
	b.WriteString("\n")
	return b.String()
}

func TestABIDocLayout(t *testing.T) {
	raw, err := os.ReadFile(abiDocPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	var sb LaneSenderBlock
	var rb LaneRelayBlock
	for _, want := range []string{
		fmt.Sprintf("`pxn_control_block` of %d bytes", ControlSize),
		fmt.Sprintf("the %d-byte\nheader, the %d-byte counters block, then %d lane summaries of %d bytes", unsafe.Sizeof(Header{}), unsafe.Sizeof(RankStats{}), LaneCount, unsafe.Sizeof(LaneSummary{})),
		fmt.Sprintf("| summary of lane `l` | control file | %d + l × %d |", unsafe.Offsetof(ControlBlock{}.Lanes), unsafe.Sizeof(LaneSummary{})),
		fmt.Sprintf("| `ready[s]` | sender block (%d bytes) | %d + s × %d |", unsafe.Sizeof(sb), unsafe.Offsetof(sb.Ready), unsafe.Sizeof(sb.Ready[0])),
		fmt.Sprintf("| `descs[s]` | sender block | %d + s × %d |", unsafe.Offsetof(sb.Descs), unsafe.Sizeof(sb.Descs[0])),
		fmt.Sprintf("| `completions[s]` | relay block (%d bytes) | %d + s × %d |", unsafe.Sizeof(rb), unsafe.Offsetof(rb.Completions), unsafe.Sizeof(rb.Completions[0])),
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("docs/abi.md lacks %q", want)
		}
	}
	begin, end := strings.Index(doc, docBegin), strings.Index(doc, docEnd)
	if begin < 0 || end < begin {
		t.Fatalf("docs/abi.md lacks the generated-layout markers")
	}
	head, body, tail := doc[:begin+len(docBegin)], doc[begin+len(docBegin):end], doc[end:]
	want := abiDocLayout()
	if body == want {
		return
	}
	if *updateABIDoc {
		if err := os.WriteFile(abiDocPath, []byte(head+want+tail), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, wantLines := strings.Split(body, "\n"), strings.Split(want, "\n")
	for i := range min(len(got), len(wantLines)) {
		if got[i] != wantLines[i] {
			t.Fatalf("docs/abi.md layout line %d is %q, Go's layout gives %q (rerun with -update-abi-doc)", i+1, got[i], wantLines[i])
		}
	}
	t.Fatalf("docs/abi.md layout has %d lines, Go's layout %d (rerun with -update-abi-doc)", len(got), len(wantLines))
}

func TestCSnake(t *testing.T) {
	tests := map[string]string{
		"CommitSeq":    "commit_seq",
		"ABIVersion":   "abi_version",
		"HCALen":       "hca_len",
		"UID":          "uid",
		"IPCHandle":    "ipc_handle",
		"SlotsPerLane": "slots_per_lane",
		"Dst":          "dst",
		"ControlBlock": "control_block",
	}
	for in, want := range tests {
		if got := cSnake(in); got != want {
			t.Errorf("cSnake(%q) = %q, want %q", in, got, want)
		}
	}
}

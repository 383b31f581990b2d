// SPDX-License-Identifier: Apache-2.0

// Package series cuts the one Mooncake patch into an ordered series of
// commits, as a definition file says, and makes the series as git commits on
// a copy of the Mooncake tree the patch is made against.
package series

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// Patch is a git-style unified diff: the files it changes, in its order.
type Patch struct {
	Files []*File
}

// File is one file's part of a patch.
type File struct {
	Path  string
	IsNew bool
	Hunks []*Hunk
}

// Hunk is one hunk of a file; OldStart is 1-based (0 for a new file).
type Hunk struct {
	OldStart, OldLines int
	Lines              []Line
}

// Line is one line of a hunk: Kind is ' ', '-' or '+'; Text has no newline.
type Line struct {
	Kind byte
	Text string
}

// Changed returns the indexes in h.Lines of its '+' and '-' lines: the
// lines a definition names, 1-based, by their place in this list.
func (h *Hunk) Changed() []int {
	var idx []int
	for i, l := range h.Lines {
		if l.Kind != ' ' {
			idx = append(idx, i)
		}
	}
	return idx
}

// File returns the patch's part for path, or nil.
func (p *Patch) File(path string) *File {
	for _, f := range p.Files {
		if f.Path == path {
			return f
		}
	}
	return nil
}

// ParsePatch reads a git-style unified diff; text before the first "diff
// --git" line (a mail header, a message) is ignored. Renames, deletions,
// binary files and files without a final newline are refused.
func ParsePatch(data []byte) (*Patch, error) {
	p := &Patch{}
	var f *File
	var h *Hunk
	oldLeft, newLeft := 0, 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if h != nil && (oldLeft > 0 || newLeft > 0) {
			if line == "" {
				line = " "
			}
			kind := line[0]
			switch kind {
			case ' ':
				oldLeft--
				newLeft--
			case '-':
				oldLeft--
			case '+':
				newLeft--
			case '\\':
				return nil, fmt.Errorf("patch line %d: %q: files without a final newline are not supported", n, line)
			default:
				return nil, fmt.Errorf("patch line %d: %q: want a hunk line (' ', '-', '+') with %d old and %d new lines left", n, line, oldLeft, newLeft)
			}
			if oldLeft < 0 || newLeft < 0 {
				return nil, fmt.Errorf("patch line %d: %q: more lines than the hunk header says", n, line)
			}
			h.Lines = append(h.Lines, Line{Kind: kind, Text: line[1:]})
			continue
		}
		switch {
		case strings.HasPrefix(line, "diff --git "):
			fields := strings.Fields(line)
			if len(fields) != 4 || !strings.HasPrefix(fields[2], "a/") || !strings.HasPrefix(fields[3], "b/") || fields[2][2:] != fields[3][2:] {
				return nil, fmt.Errorf("patch line %d: %q: want diff --git a/PATH b/PATH of one path", n, line)
			}
			f = &File{Path: fields[3][2:]}
			h = nil
			p.Files = append(p.Files, f)
		case f == nil:
		case strings.HasPrefix(line, "\\"):
			return nil, fmt.Errorf("patch line %d: %q in %s: files without a final newline are not supported", n, line, f.Path)
		case strings.HasPrefix(line, "new file mode "):
			f.IsNew = true
		case strings.HasPrefix(line, "deleted file mode "), strings.HasPrefix(line, "rename "),
			strings.HasPrefix(line, "copy "), strings.HasPrefix(line, "Binary files "), strings.HasPrefix(line, "GIT binary patch"):
			return nil, fmt.Errorf("patch line %d: %q in %s: only changed and new text files are supported", n, line, f.Path)
		case strings.HasPrefix(line, "@@ "):
			var err error
			h, newLeft, err = parseHunkHeader(line)
			if err != nil {
				return nil, fmt.Errorf("patch line %d in %s: %w", n, f.Path, err)
			}
			oldLeft = h.OldLines
			f.Hunks = append(f.Hunks, h)
		case h != nil && (strings.HasPrefix(line, "-- ") || line == "--"):
			// A mail signature after the last hunk.
			f = nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the patch: %w", err)
	}
	if h != nil && (oldLeft > 0 || newLeft > 0) {
		return nil, fmt.Errorf("patch ends inside a hunk of %s (%d old and %d new lines missing)", f.Path, oldLeft, newLeft)
	}
	if len(p.Files) == 0 {
		return nil, fmt.Errorf("the patch changes no file")
	}
	for _, f := range p.Files {
		if len(f.Hunks) == 0 {
			return nil, fmt.Errorf("%s: the patch has no hunk for it", f.Path)
		}
	}
	return p, nil
}

// parseHunkHeader reads "@@ -a,b +c,d @@": the hunk and its new line count.
func parseHunkHeader(line string) (*Hunk, int, error) {
	fields := strings.Fields(line)
	if len(fields) < 4 || fields[3] != "@@" {
		return nil, 0, fmt.Errorf("%q: not a hunk header", line)
	}
	start, count, err := parseRange(strings.TrimPrefix(fields[1], "-"))
	if err != nil || !strings.HasPrefix(fields[1], "-") {
		return nil, 0, fmt.Errorf("%q: bad old range %q", line, fields[1])
	}
	_, newCount, err := parseRange(strings.TrimPrefix(fields[2], "+"))
	if err != nil || !strings.HasPrefix(fields[2], "+") {
		return nil, 0, fmt.Errorf("%q: bad new range %q", line, fields[2])
	}
	return &Hunk{OldStart: start, OldLines: count}, newCount, nil
}

func parseRange(s string) (start, count int, err error) {
	a, b, found := strings.Cut(s, ",")
	if start, err = strconv.Atoi(a); err != nil {
		return 0, 0, err
	}
	count = 1
	if found {
		if count, err = strconv.Atoi(b); err != nil {
			return 0, 0, err
		}
	}
	return start, count, nil
}

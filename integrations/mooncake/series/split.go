// SPDX-License-Identifier: Apache-2.0

package series

import (
	"fmt"
	"strings"
)

// Split is a patch cut as a definition says: every changed line of the patch
// owned by exactly one commit.
type Split struct {
	Patch *Patch
	Def   *Definition
	// owner[file][hunk][line] is the 1-based commit that makes the change of
	// that line of the hunk (0 for context lines).
	owner map[*File][][]int
}

// Cut checks that def takes every changed line of p exactly once and returns
// the split. Errors name the file, hunk and line.
func Cut(p *Patch, def *Definition) (*Split, error) {
	s := &Split{Patch: p, Def: def, owner: map[*File][][]int{}}
	for _, f := range p.Files {
		own := make([][]int, len(f.Hunks))
		for i, h := range f.Hunks {
			own[i] = make([]int, len(h.Lines))
		}
		s.owner[f] = own
	}
	for ci, c := range def.Commits {
		k := ci + 1
		for _, t := range c.Takes {
			f := p.File(t.Path)
			if f == nil {
				return nil, fmt.Errorf("commit %d (%s) takes %s, which the patch does not change", k, c.Stage, t.Path)
			}
			hunks := []int{t.Hunk}
			if t.Hunk == 0 {
				hunks = hunks[:0]
				for i := range f.Hunks {
					hunks = append(hunks, i+1)
				}
			}
			for _, hn := range hunks {
				if hn > len(f.Hunks) {
					return nil, fmt.Errorf("commit %d (%s) takes hunk %d of %s, which has %d", k, c.Stage, hn, f.Path, len(f.Hunks))
				}
				h := f.Hunks[hn-1]
				changed := h.Changed()
				lines := t.Lines
				if lines == nil {
					for i := range changed {
						lines = append(lines, i+1)
					}
				}
				for _, ln := range lines {
					if ln > len(changed) {
						return nil, fmt.Errorf("commit %d (%s) takes line %d of hunk %d of %s, which changes %d lines", k, c.Stage, ln, hn, f.Path, len(changed))
					}
					idx := changed[ln-1]
					if prev := s.owner[f][hn-1][idx]; prev != 0 {
						return nil, fmt.Errorf("%s hunk %d line %d (%c%s) is taken by commits %d and %d", f.Path, hn, ln, h.Lines[idx].Kind, h.Lines[idx].Text, prev, k)
					}
					s.owner[f][hn-1][idx] = k
				}
			}
		}
	}
	var untaken []string
	for _, f := range p.Files {
		for hi, h := range f.Hunks {
			for ln, idx := range h.Changed() {
				if s.owner[f][hi][idx] == 0 {
					untaken = append(untaken, fmt.Sprintf("%s hunk %d line %d (%c%s)", f.Path, hi+1, ln+1, h.Lines[idx].Kind, h.Lines[idx].Text))
				}
			}
		}
	}
	if len(untaken) > 0 {
		return nil, fmt.Errorf("no commit takes %s", strings.Join(untaken, "; "))
	}
	for ci, c := range def.Commits {
		if !s.touches(ci + 1) {
			return nil, fmt.Errorf("commit %d (%s) changes nothing", ci+1, c.Stage)
		}
	}
	return s, nil
}

func (s *Split) touches(k int) bool {
	for _, own := range s.owner {
		for _, hunk := range own {
			for _, o := range hunk {
				if o == k {
					return true
				}
			}
		}
	}
	return false
}

// Touched returns the files commit k (1-based) changes, in the patch's order.
func (s *Split) Touched(k int) []*File {
	var out []*File
	for _, f := range s.Patch.Files {
		for _, hunk := range s.owner[f] {
			if contains(hunk, k) {
				out = append(out, f)
				break
			}
		}
	}
	return out
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// At returns f's content once commits 1..k are made, from base (its content
// in the base tree; nil for a new file); exists is false for a new file no
// commit up to k has added a line to. Context and removed lines must match
// base exactly: the patch is applied without fuzz.
func (s *Split) At(f *File, base []byte, k int) (content []byte, exists bool, err error) {
	var old []string
	if base != nil {
		text := string(base)
		if text != "" && !strings.HasSuffix(text, "\n") {
			return nil, false, fmt.Errorf("%s has no final newline: not supported", f.Path)
		}
		old = strings.SplitAfter(text, "\n")
		old = old[:len(old)-1]
	}
	if f.IsNew && base != nil {
		return nil, false, fmt.Errorf("%s is new in the patch but exists in the base tree", f.Path)
	}
	if !f.IsNew && base == nil {
		return nil, false, fmt.Errorf("%s is not in the base tree", f.Path)
	}
	var out strings.Builder
	pos := 0
	added := false
	for hi, h := range f.Hunks {
		start := h.OldStart - 1
		if h.OldLines == 0 {
			start = h.OldStart
		}
		if start < pos || start > len(old) {
			return nil, false, fmt.Errorf("%s hunk %d starts at line %d, out of order or past the file's %d lines", f.Path, hi+1, h.OldStart, len(old))
		}
		for ; pos < start; pos++ {
			out.WriteString(old[pos])
		}
		for li, l := range h.Lines {
			o := s.owner[f][hi][li]
			switch l.Kind {
			case ' ', '-':
				if pos >= len(old) || old[pos] != l.Text+"\n" {
					return nil, false, fmt.Errorf("%s hunk %d: line %d of the base is not %q", f.Path, hi+1, pos+1, l.Text)
				}
				if l.Kind == ' ' || o > k {
					out.WriteString(old[pos])
				}
				pos++
			case '+':
				if o <= k {
					out.WriteString(l.Text + "\n")
					added = true
				}
			}
		}
	}
	for ; pos < len(old); pos++ {
		out.WriteString(old[pos])
	}
	if f.IsNew && !added {
		return nil, false, nil
	}
	return []byte(out.String()), true, nil
}

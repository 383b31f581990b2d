// SPDX-License-Identifier: Apache-2.0

package series

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Definition is a series definition: which changed lines of the patch each
// commit takes, in order, with each commit's message.
//
// The file is line-based; '#' starts a comment line:
//
//	base COMMIT                  the Mooncake commit the patch is made against
//	author NAME <EMAIL>          the series' author
//	commit STAGE                 starts a commit (STAGE: the plan's stage)
//	take PATH [HUNK[:LINES]]...  the commit takes PATH's hunks (all when none
//	                             is named); HUNK is 1-based in the file, LINES
//	                             (e.g. 1-2,4) the 1-based places among the
//	                             hunk's '+' and '-' lines (all when none)
//	test PROGRAM                 from this commit on, the check also builds
//	                             and runs PROGRAM
//	| TEXT                       a line of the commit's message (the first
//	                             is the subject)
type Definition struct {
	Base    string
	Author  string
	Commits []*Commit
}

// Commit is one commit of the series.
type Commit struct {
	Stage   string
	Takes   []Take
	Tests   []string
	Message []string
}

// Subject is the message's first line.
func (c *Commit) Subject() string {
	if len(c.Message) == 0 {
		return ""
	}
	return c.Message[0]
}

// Take names the lines of one file a commit takes; Hunk 0 means every hunk,
// nil Lines every changed line of the hunk.
type Take struct {
	Path  string
	Hunk  int
	Lines []int
}

// ParseDefinition reads a definition; errors name the line.
func ParseDefinition(r io.Reader) (*Definition, error) {
	d := &Definition{}
	var c *Commit
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "|"); ok {
			if c == nil {
				return nil, fmt.Errorf("definition line %d: a message line before any commit", n)
			}
			c.Message = append(c.Message, strings.TrimPrefix(rest, " "))
			continue
		}
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		word, rest, _ := strings.Cut(trimmed, " ")
		rest = strings.TrimSpace(rest)
		switch word {
		case "base":
			d.Base = rest
		case "author":
			d.Author = rest
		case "commit":
			if rest == "" {
				return nil, fmt.Errorf("definition line %d: commit without its stage", n)
			}
			c = &Commit{Stage: rest}
			d.Commits = append(d.Commits, c)
		case "take", "test":
			if c == nil {
				return nil, fmt.Errorf("definition line %d: %q before any commit", n, word)
			}
			if rest == "" {
				return nil, fmt.Errorf("definition line %d: %s without an argument", n, word)
			}
			if word == "test" {
				c.Tests = append(c.Tests, strings.Fields(rest)...)
				continue
			}
			takes, err := parseTake(strings.Fields(rest))
			if err != nil {
				return nil, fmt.Errorf("definition line %d: %w", n, err)
			}
			c.Takes = append(c.Takes, takes...)
		default:
			return nil, fmt.Errorf("definition line %d: unknown directive %q", n, word)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the definition: %w", err)
	}
	if d.Base == "" || d.Author == "" {
		return nil, fmt.Errorf("the definition names no base commit or no author")
	}
	if len(d.Commits) == 0 {
		return nil, fmt.Errorf("the definition has no commit")
	}
	for i, c := range d.Commits {
		if c.Subject() == "" {
			return nil, fmt.Errorf("commit %d (%s) has no message subject", i+1, c.Stage)
		}
		if len(c.Takes) == 0 {
			return nil, fmt.Errorf("commit %d (%s) takes nothing", i+1, c.Stage)
		}
	}
	return d, nil
}

func parseTake(args []string) ([]Take, error) {
	path := args[0]
	if len(args) == 1 {
		return []Take{{Path: path}}, nil
	}
	var takes []Take
	for _, spec := range args[1:] {
		hs, ls, hasLines := strings.Cut(spec, ":")
		hunk, err := strconv.Atoi(hs)
		if err != nil || hunk < 1 {
			return nil, fmt.Errorf("take %s: hunk %q is not a number from 1", path, hs)
		}
		t := Take{Path: path, Hunk: hunk}
		if hasLines {
			if t.Lines, err = parseList(ls); err != nil {
				return nil, fmt.Errorf("take %s hunk %d: %w", path, hunk, err)
			}
		}
		takes = append(takes, t)
	}
	return takes, nil
}

// parseList reads "1-3,5" as 1, 2, 3, 5.
func parseList(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		a, b, isRange := strings.Cut(part, "-")
		lo, err := strconv.Atoi(a)
		if err != nil || lo < 1 {
			return nil, fmt.Errorf("line list %q: %q is not a number from 1", s, a)
		}
		hi := lo
		if isRange {
			if hi, err = strconv.Atoi(b); err != nil || hi < lo {
				return nil, fmt.Errorf("line list %q: bad range %q", s, part)
			}
		}
		for i := lo; i <= hi; i++ {
			out = append(out, i)
		}
	}
	return out, nil
}

// Load reads the patch and the definition and cuts the one by the other.
func Load(patchFile, defFile string) (*Split, error) {
	pb, err := os.ReadFile(patchFile)
	if err != nil {
		return nil, err
	}
	p, err := ParsePatch(pb)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", patchFile, err)
	}
	df, err := os.Open(defFile)
	if err != nil {
		return nil, err
	}
	defer df.Close()
	d, err := ParseDefinition(df)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", defFile, err)
	}
	s, err := Cut(p, d)
	if err != nil {
		return nil, fmt.Errorf("%s against %s: %w", defFile, patchFile, err)
	}
	return s, nil
}

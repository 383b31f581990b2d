// SPDX-License-Identifier: Apache-2.0

package series

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// The date every commit of the series carries, so that the same patch and
// definition always give the same commit ids.
const commitDate = "2026-08-22T00:00:00Z"

// Result is a generated series.
type Result struct {
	Repo    string   // the git repository: its first commit is the base tree
	Patches []string // git format-patch's files, one per commit, in order
	Commits []string // the series' commit ids, in order
}

// Generate copies the Mooncake tree base into out/repo as a git repository
// whose first commit is the base tree, makes the split's commits on it and
// writes git format-patch's files into out/patches. out must not exist.
func Generate(ctx context.Context, s *Split, base, out string) (*Result, error) {
	if _, err := os.Stat(out); err == nil {
		return nil, fmt.Errorf("output folder %s already exists", out)
	}
	repo := filepath.Join(out, "repo")
	if err := copyTree(ctx, base, repo); err != nil {
		return nil, err
	}
	g := gitIn(repo, s.Def.Author)
	if _, err := g(ctx, "init", "-q", "-b", "series"); err != nil {
		return nil, err
	}
	if _, err := g(ctx, "add", "-A"); err != nil {
		return nil, err
	}
	msg := fmt.Sprintf("Mooncake %s\n\nThe content of Mooncake's tree at %s, the commit the series applies to.\n", s.Def.Base, s.Def.Base)
	if _, err := g(ctx, "commit", "-q", "--no-verify", "-m", msg); err != nil {
		return nil, err
	}
	if _, err := g(ctx, "tag", "base"); err != nil {
		return nil, err
	}
	res := &Result{Repo: repo}
	for ci, c := range s.Def.Commits {
		k := ci + 1
		for _, f := range s.Touched(k) {
			path := filepath.Join(repo, filepath.FromSlash(f.Path))
			old, err := readBase(base, f.Path)
			if err != nil {
				return nil, err
			}
			content, exists, err := s.At(f, old, k)
			if err != nil {
				return nil, fmt.Errorf("commit %d (%s): %w", k, c.Stage, err)
			}
			if !exists {
				continue
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(path, content, 0o644); err != nil {
				return nil, err
			}
		}
		if _, err := g(ctx, "add", "-A"); err != nil {
			return nil, err
		}
		if _, err := g(ctx, "commit", "-q", "--no-verify", "-m", strings.Join(c.Message, "\n")+"\n"); err != nil {
			return nil, fmt.Errorf("commit %d (%s): %w", k, c.Stage, err)
		}
		id, err := g(ctx, "rev-parse", "HEAD")
		if err != nil {
			return nil, err
		}
		res.Commits = append(res.Commits, strings.TrimSpace(id))
	}
	patches := filepath.Join(out, "patches")
	list, err := g(ctx, "format-patch", "--no-signature", "-o", patches, "base..HEAD")
	if err != nil {
		return nil, err
	}
	res.Patches = strings.Fields(list)
	if len(res.Patches) != len(s.Def.Commits) {
		return nil, fmt.Errorf("git format-patch wrote %d files for %d commits", len(res.Patches), len(s.Def.Commits))
	}
	return res, nil
}

// readBase returns path's content in the base tree, nil when it is not there.
func readBase(base, path string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(base, filepath.FromSlash(path)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// CheckLast applies the whole patch with patch(1) to a copy of base in
// out/whole and compares it with the series' last tree: an error names every
// file that differs.
func CheckLast(ctx context.Context, res *Result, base, patchFile, out string) error {
	whole := filepath.Join(out, "whole")
	if err := copyTree(ctx, base, whole); err != nil {
		return err
	}
	in, err := os.Open(patchFile)
	if err != nil {
		return err
	}
	defer in.Close()
	cmd := exec.CommandContext(ctx, "patch", "-p1", "--quiet", "--forward", "-d", whole)
	cmd.Stdin = in
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s does not apply to %s: %w\n%s", patchFile, base, err, b)
	}
	diff, err := diffTrees(res.Repo, whole)
	if err != nil {
		return err
	}
	if len(diff) > 0 {
		return fmt.Errorf("the series' last tree differs from the tree with the whole patch in: %s", strings.Join(diff, ", "))
	}
	return nil
}

// diffTrees returns the files (slash paths) whose content or presence
// differs between a and b, .git and patch(1)'s backups left out.
func diffTrees(a, b string) ([]string, error) {
	fa, err := treeFiles(a)
	if err != nil {
		return nil, err
	}
	fb, err := treeFiles(b)
	if err != nil {
		return nil, err
	}
	var diff []string
	for p, ca := range fa {
		if cb, ok := fb[p]; !ok || !bytes.Equal(ca, cb) {
			diff = append(diff, p)
		}
	}
	for p := range fb {
		if _, ok := fa[p]; !ok {
			diff = append(diff, p)
		}
	}
	sort.Strings(diff)
	return diff, nil
}

func treeFiles(root string) (map[string][]byte, error) {
	files := map[string][]byte{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		if d.IsDir() || strings.HasSuffix(path, ".orig") || strings.HasSuffix(path, ".rej") {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		var content []byte
		if d.Type()&fs.ModeSymlink != 0 {
			t, err := os.Readlink(path)
			if err != nil {
				return err
			}
			content = []byte("symlink " + t)
		} else if content, err = os.ReadFile(path); err != nil {
			return err
		}
		files[filepath.ToSlash(rel)] = content
		return nil
	})
	return files, err
}

// copyTree copies the Mooncake tree src to dst, less its .git and the mark
// hack/mooncake.sh leaves in a clone it fetched.
func copyTree(ctx context.Context, src, dst string) error {
	if _, err := os.Stat(filepath.Join(src, "mooncake-transfer-engine")); err != nil {
		return fmt.Errorf("%s is not a Mooncake tree: %w", src, err)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if b, err := exec.CommandContext(ctx, "cp", "-R", src+"/.", dst).CombinedOutput(); err != nil {
		return fmt.Errorf("copying %s to %s: %w\n%s", src, dst, err, b)
	}
	for _, extra := range []string{".git", ".fetched"} {
		if err := os.RemoveAll(filepath.Join(dst, extra)); err != nil {
			return err
		}
	}
	return exec.CommandContext(ctx, "chmod", "-R", "u+w", dst).Run()
}

// gitIn returns a function running git in repo as author, at commitDate,
// with no user or system configuration read.
func gitIn(repo, author string) func(ctx context.Context, args ...string) (string, error) {
	name, email, _ := strings.Cut(author, " <")
	email = strings.TrimSuffix(email, ">")
	return func(ctx context.Context, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(),
			"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
			"GIT_AUTHOR_NAME="+name, "GIT_AUTHOR_EMAIL="+email, "GIT_AUTHOR_DATE="+commitDate,
			"GIT_COMMITTER_NAME="+name, "GIT_COMMITTER_EMAIL="+email, "GIT_COMMITTER_DATE="+commitDate)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s in %s: %w: %s", strings.Join(args, " "), repo, err, strings.TrimSpace(stderr.String()))
		}
		return string(out), nil
	}
}

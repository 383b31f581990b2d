// SPDX-License-Identifier: Apache-2.0

// Package version is the one place a PXN binary learns its release version.
//
// The Makefile and the Dockerfile stamp it from the VERSION file at the
// repository root:
//
//	go build -ldflags "-X github.com/pxn-project/pxn/internal/version.version=$(cat VERSION)"
//
// and the revision, when the build has no VCS information of its own (a
// source tree without .git, or -buildvcs=false), with
// -X github.com/pxn-project/pxn/internal/version.revision=$(git rev-parse HEAD).
//
// An unstamped build (go build, go test) reports the VERSION file's release
// with "-devel" appended, so it never claims to be a release it is not.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version and revision are set at link time; see the package comment.
var (
	version  string
	revision string
)

// Release is the release this source tree is (the VERSION file);
// test/chart's TestVersionsAgree keeps it equal to VERSION and the chart.
const Release = "0.1.0"

// String is the binary's version: the stamped one, or Release+"-devel".
func String() string {
	if version != "" {
		return version
	}
	return Release + "-devel"
}

// Revision is the VCS revision the binary was built from, or "unknown" when
// the build recorded none.
func Revision() string {
	if revision != "" {
		return revision
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return "unknown"
}

// Line is the one-line answer of a binary's --version.
func Line(binary string) string {
	return fmt.Sprintf("%s %s (revision %s, %s, %s/%s)", binary, String(), Revision(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

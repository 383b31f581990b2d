// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"regexp"
	"strconv"
	"strings"
	"time"
)

// checkNodeVerdict runs the chart's tests with real helm: one pod on the
// node checks its PxnRailMap and relays a cross-rail write there, and its
// log is one PASS line naming the node, its rails and the relayed bytes.
func (c *cluster) checkNodeVerdict() {
	t := c.t
	pod := release + "-verify-" + c.node
	// The finished pod holds a pxn.io/relay slot until it is deleted, and
	// later steps expect the node's group folders gone.
	t.Cleanup(func() {
		if out, err := c.detached().kc("delete", "pod", "-n", namespace, pod, "--ignore-not-found", "--wait=true", "--timeout=2m"); err != nil {
			t.Errorf("delete %s: %v\n%s", pod, err, out)
		}
	})
	out, err := c.run(8*time.Minute, c.helm, "test", release, "-n", namespace, "--kubeconfig", c.kubeconfig(), "--logs", "--timeout", "7m")
	t.Logf("helm test:\n%s", out)
	if err != nil {
		t.Fatalf("helm test: %v", err)
	}
	re := regexp.MustCompile(`(?m)^pxn node ` + regexp.QuoteMeta(c.node) +
		`: PASS: rail map Ready and Consistent \((\d+) rails\); cross-rail write of (\d+) MiB relayed (\d+) MiB and arrived verified$`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no PASS line for node %s in helm test's output", c.node)
	}
	rails, _ := strconv.Atoi(m[1])
	written, _ := strconv.Atoi(m[2])
	relayed, _ := strconv.Atoi(m[3])
	if rails != 8 || written == 0 || relayed != written {
		t.Errorf("verdict: %d rails, %d MiB written, %d relayed; want the fixture's 8 rails and every byte relayed", rails, written, relayed)
	}
	if n := strings.Count(out, "pxn node "); n != 1 {
		t.Errorf("%d verdict lines, want one for the one node", n)
	}
	phase := c.mustKC("get", "pod", "-n", namespace, pod, "-o", "jsonpath={.status.phase}")
	if phase != "Succeeded" {
		t.Errorf("verify pod %s: %s", pod, phase)
	}
	t.Logf("verdict: %s", m[0])
}

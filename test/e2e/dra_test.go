// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
)

const (
	draDriver      = "pxn.io"
	draDeviceClass = "relay.pxn.io" // hack/e2e/values.yaml leaves the chart's default
	nsD            = "pxn-e2e-dra"
	nsDAdmin       = "pxn-e2e-dra-admin"
	// draPrepareWait bounds how long a pod waits for its claim to be
	// allocated and prepared: the scheduler, the controller manager's claim
	// controller and the kubelet's first prepare call.
	draPrepareWait = 2 * time.Minute
)

// resourceSlice is the part of a ResourceSlice the test reads.
type resourceSlice struct {
	Spec struct {
		Driver   string `json:"driver"`
		NodeName string `json:"nodeName"`
		Pool     struct {
			Name string `json:"name"`
		} `json:"pool"`
		Devices []struct {
			Name       string `json:"name"`
			Attributes map[string]struct {
				Int    *int64  `json:"int"`
				Bool   *bool   `json:"bool"`
				String *string `json:"string"`
			} `json:"attributes"`
		} `json:"devices"`
	} `json:"spec"`
}

// nodeSlices returns the driver's ResourceSlices of the node.
func (c *cluster) nodeSlices() ([]resourceSlice, error) {
	var list struct {
		Items []resourceSlice `json:"items"`
	}
	if err := c.getJSON(&list, "resourceslices"); err != nil {
		return nil, err
	}
	var mine []resourceSlice
	for _, s := range list.Items {
		if s.Spec.Driver == draDriver && s.Spec.NodeName == c.node {
			mine = append(mine, s)
		}
	}
	return mine, nil
}

// waitRailsReady waits until the relay device the driver publishes for the
// node carries the railsReady attribute want, and the node's 8 rails.
func (c *cluster) waitRailsReady(want bool) {
	c.poll(fmt.Sprintf("the node's pxn.io relay device with railsReady=%v", want), time.Minute, func() (bool, string) {
		slices, err := c.nodeSlices()
		if err != nil {
			return false, err.Error()
		}
		devices := 0
		var got []string
		for _, s := range slices {
			for _, d := range s.Spec.Devices {
				if d.Name != "relay" {
					continue
				}
				devices++
				r, ready := d.Attributes["rails"], d.Attributes["railsReady"]
				if r.Int == nil || *r.Int != 8 || ready.Bool == nil || *ready.Bool != want {
					got = append(got, fmt.Sprintf("%s: %+v", d.Name, d.Attributes))
				}
			}
		}
		if devices == 0 {
			return false, fmt.Sprintf("%d slices, no device", len(slices))
		}
		return len(got) == 0, strings.Join(got, "; ")
	})
}

// checkDRASlice: the driver publishes the node's relay device with the
// rails the node discovered.
func (c *cluster) checkDRASlice() {
	c.waitRailsReady(true)
	c.t.Logf("ResourceSlices of %s:\n%s", draDriver, c.mustKC("get", "resourceslices", "-o", "wide"))
}

func claimYAML(ns, name, config string, adminAccess bool) string {
	admin := ""
	if adminAccess {
		admin = "\n          adminAccess: true"
	}
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: %s
  namespace: %s
spec:
  devices:
    requests:
      - name: relay
        exactly:
          deviceClassName: %s%s%s
`, name, ns, draDeviceClass, admin, config)
}

func claimTemplateYAML(ns, name string) string {
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: %s
  namespace: %s
spec:
  spec:
    devices:
      requests:
        - name: relay
          exactly:
            deviceClassName: %s
`, name, ns, draDeviceClass)
}

var (
	// d1 and d2 share the claim job4, d3 has a claim of its own, made from
	// the template own; d4 joins job4 after the restarts.
	d1 = workload{nsD, "d1", relayHolder{claim: "job4"}}
	d2 = workload{nsD, "d2", relayHolder{claim: "job4"}}
	d3 = workload{nsD, "d3", relayHolder{template: "own"}}
	d4 = workload{nsD, "d4", relayHolder{claim: "job4"}}
)

func (c *cluster) claimUID(ns, name string) string {
	c.t.Helper()
	uid := c.mustKC("get", "resourceclaim", "-n", ns, name, "-o", "jsonpath={.metadata.uid}")
	if uid == "" {
		c.t.Fatalf("resourceclaim %s/%s has no UID", ns, name)
	}
	return uid
}

// podClaim is the name of the claim the pod's template made for it.
func (c *cluster) podClaim(ns, pod string) string {
	c.t.Helper()
	name := c.mustKC("get", "pod", "-n", ns, pod, "-o", "jsonpath={.status.resourceClaimStatuses[0].resourceClaimName}")
	if name == "" {
		c.t.Fatalf("pod %s/%s has no generated claim", ns, pod)
	}
	return name
}

func (c *cluster) draGroupsDir() string { return filepath.Join(c.draShmDir, "groups") }

// dirNames lists a host folder; a missing folder is empty.
func dirNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, err
}

// checkDRAClaims starts pods that hold the relay through ResourceClaims:
// two pods of one claim share their registry folder, a pod of another
// claim sees only its own; on the host each prepared claim has one group
// folder and one CDI spec.
func (c *cluster) checkDRAClaims() {
	t := c.t
	var m pxnRailMap
	if err := c.getJSON(&m, "pxnrailmaps", c.node); err != nil {
		t.Fatal(err)
	}
	c.mustKC("create", "namespace", nsD)
	c.root.Cleanup(func() {
		if c.root.Failed() && c.reuse {
			_, _ = c.detached().kc("delete", "namespace", nsD, nsDAdmin, "--ignore-not-found", "--wait=false")
		}
	})
	c.apply(claimYAML(nsD, "job4", "", false) + "---\n" + claimTemplateYAML(nsD, "own"))
	start := time.Now()
	c.startWorkloads(d1, d2, d3)
	t.Logf("3 pods with ResourceClaims started in %.1f s", time.Since(start).Seconds())

	for _, w := range []workload{d1, d2, d3} {
		c.checkMember(w, m.Status.RailMap)
	}
	if t.Failed() {
		t.FailNow()
	}
	for w, files := range map[workload][]string{d1: {"d1.txt", "d2.txt"}, d2: {"d1.txt", "d2.txt"}, d3: {"d3.txt"}} {
		if got := c.listDir(w.ns, w.name); !reflect.DeepEqual(got, files) {
			t.Errorf("%s/%s sees %v in %s, want %v", w.ns, w.name, got, registryRoot, files)
		}
	}

	// The host: one group folder per claim, keyed by the claim's UID, and
	// one CDI spec per prepared claim.
	own := c.podClaim(nsD, d3.name)
	want := map[string][]string{
		c.draKey(nsD, "claim", c.claimUID(nsD, "job4")): {"d1.txt", "d2.txt"},
		c.draKey(nsD, "claim", c.claimUID(nsD, own)):    {"d3.txt"},
	}
	var wantKeys []string
	for k, files := range want {
		wantKeys = append(wantKeys, k)
		have, err := dirNames(filepath.Join(c.draGroupsDir(), k))
		if err != nil || !reflect.DeepEqual(have, files) {
			t.Errorf("host group folder %s holds %v (%v), want %v", k, have, err, files)
		}
	}
	sort.Strings(wantKeys)
	got, err := dirNames(c.draGroupsDir())
	if err != nil || !reflect.DeepEqual(got, wantKeys) {
		t.Errorf("host %s holds %v (%v), want the folders %v", c.draGroupsDir(), got, err, wantKeys)
	}
	specs, err := dirNames(c.cdiDir)
	if err != nil || len(specs) != 2 {
		t.Errorf("CDI folder %s holds %v (%v), want one spec for each of the 2 prepared claims", c.cdiDir, specs, err)
	}
	t.Logf("claim group folders on the host (%s): %v; CDI specs: %v", c.draGroupsDir(), got, specs)
}

// checkDRARankPair runs two ranks of one claim: they relay through each
// other's staging rings as the device plugin's job3 did, and once both pods
// are gone the claim's folder is too.
func (c *cluster) checkDRARankPair() {
	c.apply(claimYAML(nsD, "job5", "", false))
	key := c.draKey(nsD, "claim", c.claimUID(nsD, "job5"))
	c.runRankPair(nsD, []string{"drank0", "drank1"}, relayHolder{claim: "job5"})
	dir := filepath.Join(c.draGroupsDir(), key)
	c.poll("job5's group folder removed once its pods are gone", time.Minute, func() (bool, string) {
		_, err := os.Lstat(dir)
		return os.IsNotExist(err), fmt.Sprintf("%s: %v", dir, err)
	})
	c.mustKC("delete", "resourceclaim", "-n", nsD, "job5", "--wait=true", "--timeout=1m")
}

// draBenchPod is a pod of pxn-bench's ranks holding the relay through a
// claim of its own, made from the template own; --hold-after keeps the
// ranks registered after the transfer until the step deletes the pod.
func draBenchPod(ns, name, image string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  resourceClaims:
    - name: relay
      resourceClaimTemplateName: own
  containers:
    - name: bench
      image: %s
      imagePullPolicy: Never
      command: ["/usr/local/bin/pxn-bench", "run", "--device=host", "--ranks=%d", "--bytes=%d", "--pattern=cross-rail", "--hold-after=600s"]
      resources:
        claims:
          - name: relay
`, name, ns, image, benchRanks, benchBytes)
}

// rankSeries sums the pxn_ranks samples of the agent's /metrics text whose
// labels include every one of want.
func rankSeries(text string, want map[string]string) (sum float64, lines []string) {
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "pxn_ranks{") {
			continue
		}
		lines = append(lines, line)
		match := true
		for k, v := range want {
			match = match && strings.Contains(line, fmt.Sprintf("%s=%q", k, v))
		}
		if !match {
			continue
		}
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			sum += v
		}
	}
	return sum, lines
}

// httpGetText reads the body at url, which must answer 200 OK.
func httpGetText(url string) (string, error) {
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(body), err
}

// checkDRARankMetrics runs pxn-bench's ranks in a pod whose claim is its
// own: the agent's pxn_ranks count them under the claim's group folder,
// in the driver's shm folder, with the pod's namespace and name (from the
// claim's owner record).
func (c *cluster) checkDRARankMetrics() {
	t := c.t
	const name = "dbench"
	c.root.Cleanup(func() {
		if c.root.Failed() && c.reuse {
			_, _ = c.detached().kc("delete", "pod", "-n", nsD, name, "--ignore-not-found", "--wait=false")
		}
	})
	c.apply(draBenchPod(nsD, name, c.image))
	target := c.agentTarget()
	var key string
	c.poll(fmt.Sprintf("pxn_ranks of the agent: %d ranks of pod %s/%s in its claim's group folder", benchRanks, nsD, name), podStartTimeout+5*time.Minute, func() (bool, string) {
		if key == "" {
			claim, err := c.kc("get", "pod", "-n", nsD, name, "-o", "jsonpath={.status.resourceClaimStatuses[0].resourceClaimName}")
			if err != nil || claim == "" {
				return false, fmt.Sprintf("the pod's claim not made yet (%v)", err)
			}
			uid, err := c.kc("get", "resourceclaim", "-n", nsD, claim, "-o", "jsonpath={.metadata.uid}")
			if err != nil || uid == "" {
				return false, fmt.Sprintf("claim %s: no UID (%v)", claim, err)
			}
			key = c.draKey(nsD, "claim", uid)
		}
		var p pod
		if err := c.getJSON(&p, "pod", "-n", nsD, name); err == nil && (p.Status.Phase == "Succeeded" || p.Status.Phase == "Failed") {
			logs, _ := c.kc("logs", "-n", nsD, name)
			t.Fatalf("%s ended (%s) before the agent showed its ranks:\n%s", name, p.summary(), lastLines(logs, 20))
		}
		body, err := httpGetText("http://" + target + "/metrics")
		if err != nil {
			return false, err.Error()
		}
		n, lines := rankSeries(body, map[string]string{"group": key, "namespace": nsD, "pod": name, "node": c.node})
		return n == benchRanks, fmt.Sprintf("%v ranks of group %s; pxn_ranks:\n%s", n, key, strings.Join(lines, "\n"))
	})
	t.Logf("the agent names pod %s/%s for the %d ranks of its claim's group folder %s", nsD, name, benchRanks, key)
	c.mustKC("delete", "pod", "-n", nsD, name, "--wait=true", "--timeout=1m")
}

// checkDRARestarts restarts the driver's pod, then the kubelet: the running
// pods keep their folder, a new pod of job4 joins it, and the driver
// publishes the node's device again.
func (c *cluster) checkDRARestarts() {
	t := c.t
	sel := "app.kubernetes.io/component=dra-plugin"
	old := c.mustKC("get", "pods", "-n", namespace, "-l", sel, "-o", "jsonpath={.items[*].metadata.name}")
	c.mustKC("delete", "pod", "-n", namespace, "-l", sel, "--wait=true", "--timeout=1m")
	c.poll("a new DRA driver pod Ready", podStartTimeout, func() (bool, string) {
		var pods podList
		if err := c.getJSON(&pods, "pods", "-n", namespace, "-l", sel); err != nil {
			return false, err.Error()
		}
		var states []string
		for _, p := range pods.Items {
			states = append(states, p.summary())
			if p.Metadata.Name != old && p.ready() {
				return true, ""
			}
		}
		return false, strings.Join(states, "; ")
	})
	rctx, cancel := context.WithTimeout(c.ctx, 3*time.Minute)
	out, err := c.script(rctx, "restart-kubelet")
	cancel()
	if err != nil {
		t.Fatalf("restart-kubelet: %v\n%s", err, out)
	}
	c.waitRailsReady(true)
	c.checkKeptFiles("the restarts", []string{"d1.txt", "d2.txt"}, d1, d2)
	c.startWorkloads(d4)
	if got := c.listDir(d4.ns, d4.name); !reflect.DeepEqual(got, []string{"d1.txt", "d2.txt"}) {
		t.Errorf("d4 (job4, started after the restarts) sees %v, want d1's and d2's files", got)
	}
}

// checkDRAAdminAccess: a claim with admin access, in a namespace allowed
// to make one, sees every claim's group folder, read-only.
func (c *cluster) checkDRAAdminAccess() {
	t := c.t
	c.mustKC("create", "namespace", nsDAdmin)
	c.mustKC("label", "namespace", nsDAdmin, "resource.kubernetes.io/admin-access=true")
	c.apply(claimYAML(nsDAdmin, "diag", "", true))
	admin := workload{nsDAdmin, "diag", relayHolder{claim: "diag"}}
	c.startWorkloads(admin)
	key := c.draKey(nsD, "claim", c.claimUID(nsD, "job4"))
	got := c.listDir(admin.ns, admin.name)
	found := false
	for _, name := range got {
		found = found || name == key
	}
	if !found {
		t.Errorf("the admin claim's pod sees %v in %s, want job4's folder %s among them", got, registryRoot, key)
	}
	if out, err := c.exec(admin.ns, admin.name, "cat", filepath.Join(registryRoot, key, "d1.txt")); err != nil || out != "from "+nsD+"/d1" {
		t.Errorf("the admin claim's pod reads d1's file: %q, %v", out, err)
	}
	if _, err := c.exec(admin.ns, admin.name, "write", filepath.Join(registryRoot, key, "diag.txt"), "x"); err == nil {
		t.Errorf("the admin claim's pod wrote into job4's folder; want it read-only")
	}
	c.mustKC("delete", "namespace", nsDAdmin, "--wait=true", "--timeout=2m")
}

// podEventWith waits for an Event about the pod whose message holds every
// one of want, and returns it.
func (c *cluster) podEventWith(ns, pod string, want ...string) string {
	var found string
	c.poll(fmt.Sprintf("an Event about %s/%s saying %q", ns, pod, want), draPrepareWait, func() (bool, string) {
		var evs struct {
			Items []struct {
				Reason  string `json:"reason"`
				Message string `json:"message"`
			} `json:"items"`
		}
		if err := c.getJSON(&evs, "events", "-n", ns, "--field-selector", "involvedObject.name="+pod); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range evs.Items {
			all := true
			for _, w := range want {
				all = all && strings.Contains(e.Message, w)
			}
			if all {
				found = e.Reason + ": " + e.Message
				return true, ""
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		return false, strings.Join(seen, " | ")
	})
	return found
}

// checkDRABadClaims: a claim whose parameters the driver does not know, and
// a claim on a node whose rails are not ready, are not prepared, and the
// pod's Events say why.
func (c *cluster) checkDRABadClaims() {
	t := c.t
	bogus := `
    config:
      - requests: ["relay"]
        opaque:
          driver: pxn.io
          parameters:
            apiVersion: pxn.io/v1alpha1
            kind: RelayConfig
            stripes: 4`
	c.apply(claimYAML(nsD, "bogus", bogus, false) + "---\n" + probePod(nsD, "d5", relayHolder{claim: "bogus"}))
	t.Logf("unknown parameters: %s", c.podEventWith(nsD, "d5", "stripes"))
	c.mustKC("delete", "pod", "-n", nsD, "d5", "--wait=true", "--timeout=1m")
	c.mustKC("delete", "resourceclaim", "-n", nsD, "bogus", "--wait=true", "--timeout=1m")

	// Every port of the node's fixture DOWN; the ports come back at the end.
	states := c.fixturePortStates()
	restore := func() {
		for _, f := range states {
			if err := os.WriteFile(f, []byte("4: ACTIVE\n"), 0o644); err != nil {
				t.Errorf("restore %s: %v", f, err)
			}
		}
	}
	defer restore()
	for _, f := range states {
		if err := os.WriteFile(f, []byte("1: DOWN\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c.waitRailsReady(false)
	c.apply(claimYAML(nsD, "notready", "", false) + "---\n" + probePod(nsD, "d6", relayHolder{claim: "notready"}))
	t.Logf("rails not ready: %s", c.podEventWith(nsD, "d6", "are not ready"))
	c.mustKC("delete", "pod", "-n", nsD, "d6", "--wait=true", "--timeout=1m")
	c.mustKC("delete", "resourceclaim", "-n", nsD, "notready", "--wait=true", "--timeout=1m")
	restore()
	c.waitRailsReady(true)
}

// fixturePortStates lists the state files of every HCA port of the node's
// sysfs fixture, which the chart's components read as the host's.
func (c *cluster) fixturePortStates() []string {
	c.t.Helper()
	var files []string
	root := filepath.Join(c.dir, "fixtures", "hgx-8gpu", "sys", "devices")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Name() == "state" && filepath.Base(filepath.Dir(filepath.Dir(path))) == "ports" {
			files = append(files, path)
		}
		return nil
	})
	if err != nil || len(files) == 0 {
		c.t.Fatalf("no port state files in the cluster's fixture %s (%v)", root, err)
	}
	return files
}

// checkDRACleanup deletes the claims' pods and namespace: every claim
// group folder, owner record and CDI spec the driver made goes with them.
func (c *cluster) checkDRACleanup() {
	c.mustKC("delete", "namespace", nsD, "--wait=true", "--timeout=2m")
	c.poll("claim group folders and CDI specs removed", time.Minute, func() (bool, string) {
		groups, err := dirNames(c.draGroupsDir())
		if err != nil {
			return false, err.Error()
		}
		specs, err := dirNames(c.cdiDir)
		if err != nil {
			return false, err.Error()
		}
		owners, err := dirNames(filepath.Join(c.draShmDir, "owners"))
		if err != nil {
			return false, err.Error()
		}
		return len(groups) == 0 && len(specs) == 0 && len(owners) == 0, fmt.Sprintf("group folders %v, CDI specs %v, owner records %v", groups, specs, owners)
	})
}

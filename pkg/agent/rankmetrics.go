// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/group"
	"github.com/pxn-project/pxn/pkg/podresources"
	"github.com/pxn-project/pxn/pkg/staging"
	"github.com/pxn-project/pxn/pkg/staging/registry"
	"github.com/pxn-project/pxn/pkg/staging/registry/inspect"
)

// RankLabels are the labels a rank's metrics can carry, in order: the node,
// the rank's canonical rail and HCA, the device its staging arena lives in
// (a GPU's PCI bus id, or "host"), the group folder its job's ranks meet in
// (a node plugin's group key) and the namespace and pod holding that folder
// (from the folder's owner records).
var RankLabels = []string{"node", "rail", "hca", "device", "group", "namespace", "pod"}

// RankMetricsOptions say where the node's ranks register and how their
// metrics are labelled.
type RankMetricsOptions struct {
	NodeName string
	// ShmDirs are the node plugins' host shm folders (the device plugin's
	// and the DRA driver's --shm-dir): their group folders, in which the
	// ranks of each job register, and the owner records (pkg/group) that
	// name the namespace and pods holding each folder. A folder that does
	// not exist holds no ranks.
	ShmDirs []string
	// Pods lists the pods running on the node: a pod that an owner record
	// names and the kubelet does not list is left out of the labels. Nil,
	// or a failed call, takes the records as they are.
	Pods podresources.Lister
	// PodLookupTimeout bounds one Pods call; default 2 s.
	PodLookupTimeout time.Duration
	// Labels are the RankLabels the metrics carry; ranks whose kept
	// labels agree are summed. Empty: every one.
	Labels []string
	// StaleAfter leaves out a rank whose heartbeat is older: it has
	// exited, or hangs. Default 10 s.
	StaleAfter time.Duration
	Logger     klog.Logger
}

// rankMetric is one pxn_* metric of the ranks: how to read it from a rank's
// counters, and its extra label ("reason", "direction") with the value of
// each series.
type rankMetric struct {
	name, help string
	typ        prometheus.ValueType
	extra      string
	values     []string
	// read fills one value per entry of values.
	read func(s *inspect.StatsReport, out []float64)
}

func counter(name, help string, read func(s *inspect.StatsReport) uint64) rankMetric {
	return rankMetric{name: name, help: help, typ: prometheus.CounterValue, values: []string{""},
		read: func(s *inspect.StatsReport, out []float64) { out[0] = float64(read(s)) }}
}

func byReason(name, help string, read func(s *inspect.StatsReport) *staging.FallbackCounts) rankMetric {
	reasons := make([]string, staging.FallbackReasons)
	for r := range reasons {
		reasons[r] = staging.FallbackReasonName(r)
	}
	return rankMetric{name: name, help: help, typ: prometheus.CounterValue, extra: "reason", values: reasons,
		read: func(s *inspect.StatsReport, out []float64) {
			for r, n := range read(s) {
				out[r] = float64(n)
			}
		}}
}

// rankMetrics are the metrics of each label set of ranks, summed over its
// ranks.
var rankMetrics = []rankMetric{
	{name: "pxn_ranks", help: "Live PXN ranks (engines registered in a group folder, heartbeat fresh).", typ: prometheus.GaugeValue, values: []string{""},
		read: func(_ *inspect.StatsReport, out []float64) { out[0] = 1 }},
	counter("pxn_relayed_bytes_total", "Bytes of the ranks' cross-rail writes that a relay on the target's rail staged and completed.",
		func(s *inspect.StatsReport) uint64 { return s.RelayedBytes }),
	counter("pxn_relayed_pieces_total", "Pieces (up to 8 MiB) of the ranks' cross-rail writes that a relay staged and completed.",
		func(s *inspect.StatsReport) uint64 { return s.RelayedPieces }),
	counter("pxn_forwarded_bytes_total", "Bytes the ranks forwarded on their own rail as relays for other ranks (the second hop).",
		func(s *inspect.StatsReport) uint64 { return s.ForwardedBytes }),
	counter("pxn_forwarded_pieces_total", "Pieces the ranks forwarded as relays for other ranks.",
		func(s *inspect.StatsReport) uint64 { return s.ForwardedPieces }),
	counter("pxn_direct_bytes_total", "Bytes the ranks sent straight through their own NIC at classification: same rail, host memory, reads, or no relay on the target's rail.",
		func(s *inspect.StatsReport) uint64 { return s.DirectBytes }),
	byReason("pxn_fallback_bytes_total", "Bytes meant for a relay that went direct before their doorbell, by reason.",
		func(s *inspect.StatsReport) *staging.FallbackCounts { return &s.FallbackBytes }),
	byReason("pxn_fallback_pieces_total", "Pieces meant for a relay that went direct before their doorbell, by reason.",
		func(s *inspect.StatsReport) *staging.FallbackCounts { return &s.FallbackPieces }),
	counter("pxn_failed_pieces_total", "Pieces handed to a relay that failed (relay gone, second hop failed, invalid descriptor, shutdown).",
		func(s *inspect.StatsReport) uint64 { return s.FailedPieces }),
	counter("pxn_second_hop_failures_total", "Relayed pieces whose second hop failed or timed out.",
		func(s *inspect.StatsReport) uint64 { return s.SecondHopFailures }),
	counter("pxn_invalid_descs_total", "Descriptors the ranks refused as relays (a sender's bug or a hostile peer).",
		func(s *inspect.StatsReport) uint64 { return s.InvalidDescs }),
	counter("pxn_credit_waits_total", "Times a lane had work queued but no credit (the relay's ring was full).",
		func(s *inspect.StatsReport) uint64 { return s.CreditWaits }),
	counter("pxn_lane_quarantines_total", "Lanes taken out of service after a first-hop copy or doorbell failure, or a relay that made no progress.",
		func(s *inspect.StatsReport) uint64 { return s.LaneQuarantines }),
	{name: "pxn_pump_cpu_seconds_total", help: "CPU time of the ranks' pump threads.", typ: prometheus.CounterValue, values: []string{""},
		read: func(s *inspect.StatsReport, out []float64) { out[0] = s.PumpCPU.Seconds() }},
	{name: "pxn_lanes", help: "Lanes held: outbound, on relays of other rails; inbound, the ranks' own lanes held by senders.", typ: prometheus.GaugeValue,
		extra: "direction", values: []string{"outbound", "inbound"},
		read: func(s *inspect.StatsReport, out []float64) {
			out[0], out[1] = float64(s.OutboundLanes), float64(s.InboundLanes)
		}},
}

// What one group folder may cost a scrape: its registries are looked for in
// the folder and in at most maxGroupRoots-1 folders below it, at most
// maxGroupRanks of its ranks are exported, and at most maxGroupOwners of
// its owner records are read. A job has a handful of ranks; a workload
// that fills its folder with fake registries only loses its own metrics,
// and the agent's cost and the label cardinality stay bounded.
const (
	maxGroupRoots  = 16
	maxGroupRanks  = 64
	maxGroupOwners = 256
)

// RankCollector serves the pxn_* metrics of the node's ranks. It reads the
// ranks' control files at every scrape, through inspect.Root: read
// only, no lock, nothing a pump waits for. A rank that left (its file
// removed, its heartbeat stale) is gone from the next scrape.
type RankCollector struct {
	o     RankMetricsOptions
	keep  []int // indexes into RankLabels
	descs []*prometheus.Desc
	// stale and refused are the gauges of ranks that are not live: a
	// heartbeat older than StaleAfter, a refused configuration.
	stale, refused *prometheus.Desc
	errors         prometheus.Counter
}

var _ prometheus.Collector = (*RankCollector)(nil)

// NewRankCollector checks o and returns its collector.
func NewRankCollector(o RankMetricsOptions) (*RankCollector, error) {
	o.ShmDirs = slices.DeleteFunc(slices.Clone(o.ShmDirs), func(d string) bool { return d == "" })
	if len(o.ShmDirs) == 0 {
		return nil, fmt.Errorf("rank metrics: no shm folder")
	}
	if o.StaleAfter <= 0 {
		o.StaleAfter = 10 * time.Second
	}
	if o.PodLookupTimeout <= 0 {
		o.PodLookupTimeout = 2 * time.Second
	}
	if len(o.Labels) == 0 {
		o.Labels = RankLabels
	}
	c := &RankCollector{o: o}
	for _, l := range o.Labels {
		i := slices.Index(RankLabels, l)
		if i < 0 {
			return nil, fmt.Errorf("rank metrics: label %q: want some of %s", l, strings.Join(RankLabels, ","))
		}
		if slices.Contains(c.keep, i) {
			return nil, fmt.Errorf("rank metrics: label %q given twice", l)
		}
		c.keep = append(c.keep, i)
	}
	slices.Sort(c.keep)
	names := make([]string, len(c.keep))
	for j, i := range c.keep {
		names[j] = RankLabels[i]
	}
	for _, m := range rankMetrics {
		labels := names
		if m.extra != "" {
			labels = append(slices.Clone(names), m.extra)
		}
		c.descs = append(c.descs, prometheus.NewDesc(m.name, m.help, labels, nil))
	}
	c.stale = prometheus.NewDesc("pxn_stale_ranks",
		"Ranks whose control file is published but whose heartbeat is older than the agent's stale-after: hung, or exited without closing. Senders give them no new tickets and write to their rail direct.",
		names, nil)
	c.refused = prometheus.NewDesc("pxn_rank_config_refused",
		"Processes that refused their PXN configuration and send everything direct, by the MC_PXN_* variable refused (from the refusal records in the group folders).",
		append(slices.Clone(names), "variable"), nil)
	c.errors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pxn_agent_rank_read_errors_total",
		Help: "Ranks left out of a scrape (a corrupt control file, a counters block that stayed busy, names that are not UTF-8, a group folder over its bound of ranks), owner records left unread (corrupt, over a folder's bound), and failed pod lookups.",
	})
	return c, nil
}

// Describe sends the descriptors of every metric.
func (c *RankCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
	ch <- c.stale
	ch <- c.refused
	c.errors.Describe(ch)
}

// rankSeries is the sum of one label set's ranks: a value per metric and
// series.
type rankSeries struct {
	labels []string
	values [][]float64
}

// Collect reads every rank and sends the sums of each label set.
func (c *RankCollector) Collect(ch chan<- prometheus.Metric) {
	scan := c.scan()
	sums := map[string]*rankSeries{}
	var order []string
	for _, r := range scan.live {
		kept := c.kept(r.labels())
		key := strings.Join(kept, "\x00")
		s := sums[key]
		if s == nil {
			s = &rankSeries{labels: kept, values: make([][]float64, len(rankMetrics))}
			for m := range rankMetrics {
				s.values[m] = make([]float64, len(rankMetrics[m].values))
			}
			sums[key] = s
			order = append(order, key)
		}
		out := make([]float64, staging.FallbackReasons)
		for m, rm := range rankMetrics {
			rm.read(r.Stats, out[:len(rm.values)])
			for v := range rm.values {
				s.values[m][v] += out[v]
			}
		}
	}
	sort.Strings(order)
	for _, key := range order {
		s := sums[key]
		for m, rm := range rankMetrics {
			for v, extra := range rm.values {
				labels := s.labels
				if rm.extra != "" {
					labels = append(slices.Clone(s.labels), extra)
				}
				metric, err := prometheus.NewConstMetric(c.descs[m], rm.typ, s.values[m][v], labels...)
				if err != nil {
					// Ranks checks every label value; nothing should get here.
					c.errors.Inc()
					continue
				}
				ch <- metric
			}
		}
	}
	gauge := func(d *prometheus.Desc, counts map[string]float64) {
		keys := make([]string, 0, len(counts))
		for k := range counts {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			metric, err := prometheus.NewConstMetric(d, prometheus.GaugeValue, counts[k], strings.Split(k, "\x00")...)
			if err != nil {
				c.errors.Inc()
				continue
			}
			ch <- metric
		}
	}
	stale := map[string]float64{}
	for _, r := range scan.stale {
		stale[strings.Join(c.kept(r.labels()), "\x00")]++
	}
	gauge(c.stale, stale)
	refused := map[string]float64{}
	for _, r := range scan.refused {
		kept := strings.Join(c.kept(r.labels()), "\x00")
		for _, v := range r.Variables {
			refused[kept+"\x00"+v]++
		}
	}
	gauge(c.refused, refused)
	c.errors.Collect(ch)
}

// kept picks the collector's labels out of a full set of RankLabels values.
func (c *RankCollector) kept(vals []string) []string {
	kept := make([]string, len(c.keep))
	for j, i := range c.keep {
		kept[j] = vals[i]
	}
	return kept
}

// LiveRank is one rank the agent exports: where it is and what it
// published.
type LiveRank struct {
	Node, Rail, HCA, Group, Namespace, Pod string
	// Registry is the rank's registry directory.
	Registry string
	Pid      int
	Stats    *inspect.StatsReport
}

func (r LiveRank) labels() []string {
	device := ""
	if r.Stats != nil {
		device = r.Stats.Device
	}
	return []string{r.Node, r.Rail, r.HCA, device, r.Group, r.Namespace, r.Pod}
}

// RefusedRank is a process of a group folder that refused its PXN
// configuration: it registered no control file, and left a refusal record
// (registry.WriteRefusal) in its registry root instead.
type RefusedRank struct {
	Node, Group, Namespace, Pod string
	// Root is the registry root holding the record.
	Root string
	Pid  int
	// Variables are the names of the variables it refused, each once.
	Variables []string
}

func (r RefusedRank) labels() []string {
	return []string{r.Node, "", "", "", r.Group, r.Namespace, r.Pod}
}

// nodeScan is what one read of the node's group folders found.
type nodeScan struct {
	live    []LiveRank
	stale   []LiveRank
	refused []RefusedRank
}

// Ranks lists the live ranks of the node's group folders: published
// (READY or CLOSING), heartbeat no older than StaleAfter, counters
// readable. A group folder's ranks may register in it or in a folder one
// level below (a tool that makes its own registry root in the group
// folder, as pxn-bench does).
func (c *RankCollector) Ranks() []LiveRank { return c.scan().live }

// Refused lists the processes of the node's group folders that refused
// their configuration.
func (c *RankCollector) Refused() []RefusedRank { return c.scan().refused }

func (c *RankCollector) scan() nodeScan {
	var out nodeScan
	var live *livePods
	for _, shm := range c.o.ShmDirs {
		c.scanShm(shm, &live, &out)
	}
	return out
}

// scanShm adds the ranks of the group folders in one shm folder to out.
// live is looked up on the first folder that has group folders.
func (c *RankCollector) scanShm(shm string, live **livePods, out *nodeScan) {
	log := c.o.Logger
	groupsDir := contract.GroupsDir(shm)
	keys, err := os.ReadDir(groupsDir)
	if err != nil {
		// No group folder yet: the plugin has served no pod.
		log.V(4).Info("no group folders", "dir", groupsDir, "err", err.Error())
		return
	}
	if *live == nil {
		*live = c.livePods()
	}
	pods := c.groupOwners(shm, *live)
	for _, k := range keys {
		if !k.IsDir() {
			continue
		}
		dir := filepath.Join(groupsDir, k.Name())
		roots := []string{dir}
		if subs, err := os.ReadDir(dir); err == nil {
			for _, s := range subs {
				// Not a symlink: the folder's registries stay the folder's.
				if s.IsDir() && !strings.HasPrefix(s.Name(), registry.GroupDirPrefix) && len(roots) < maxGroupRoots {
					roots = append(roots, filepath.Join(dir, s.Name()))
				}
			}
		}
		ns, pod := pods.of(k.Name())
		inGroup, staleInGroup, refusedInGroup := 0, 0, 0
		for _, root := range roots {
			refusals, bad, err := registry.ReadRefusals(root)
			if err == nil {
				for i := 0; i < bad; i++ {
					c.errors.Inc()
				}
				for _, rf := range refusals {
					if refusedInGroup++; refusedInGroup > maxGroupRanks {
						c.errors.Inc()
						continue
					}
					var vars []string
					for _, v := range rf.Variables {
						if !slices.Contains(vars, v.Name) {
							vars = append(vars, v.Name)
						}
					}
					out.refused = append(out.refused, RefusedRank{Node: c.o.NodeName, Group: k.Name(), Namespace: ns, Pod: pod,
						Root: root, Pid: rf.Pid, Variables: vars})
				}
			}
			groups, err := inspect.Root(root, c.o.StaleAfter)
			if err != nil {
				continue
			}
			for _, g := range groups {
				for _, rr := range g.Ranks {
					if !rr.Published || (rr.State != "READY" && rr.State != "CLOSING") || rr.HeartbeatAge < 0 {
						continue
					}
					if rr.HeartbeatAge > c.o.StaleAfter {
						if !utf8.ValidString(rr.Rail) || !utf8.ValidString(rr.HCA) ||
							(rr.Stats != nil && !utf8.ValidString(rr.Stats.Device)) {
							c.errors.Inc()
							continue
						}
						if staleInGroup++; staleInGroup > maxGroupRanks {
							c.errors.Inc()
							continue
						}
						out.stale = append(out.stale, LiveRank{Node: c.o.NodeName, Rail: rr.Rail, HCA: rr.HCA, Group: k.Name(),
							Namespace: ns, Pod: pod, Registry: g.Path, Pid: rr.Pid, Stats: rr.Stats})
						continue
					}
					if rr.Stats == nil {
						c.errors.Inc()
						log.V(2).Info("rank counters unreadable", "registry", g.Path, "rank", rr.File, "err", rr.StatsError)
						continue
					}
					if !utf8.ValidString(rr.Rail) || !utf8.ValidString(rr.HCA) || !utf8.ValidString(rr.Stats.Device) {
						c.errors.Inc()
						log.V(2).Info("rank names are not UTF-8", "registry", g.Path, "rank", rr.File)
						continue
					}
					if inGroup++; inGroup > maxGroupRanks {
						c.errors.Inc()
						continue
					}
					out.live = append(out.live, LiveRank{Node: c.o.NodeName, Rail: rr.Rail, HCA: rr.HCA, Group: k.Name(),
						Namespace: ns, Pod: pod, Registry: g.Path, Pid: rr.Pid, Stats: rr.Stats})
				}
			}
		}
	}
}

// groupPods are the pods holding each group folder, by group key.
type groupPods map[string][]podRef

type podRef struct{ namespace, name string }

// of returns the namespace and pod of a group folder: the pod when one
// holds it; the namespace alone when several pods of one job share it;
// neither when none is known.
func (g groupPods) of(key string) (namespace, pod string) {
	ps := g[key]
	if len(ps) == 0 {
		return "", ""
	}
	namespace, pod = ps[0].namespace, ps[0].name
	for _, p := range ps[1:] {
		if p.name != pod {
			pod = ""
		}
		if p.namespace != namespace {
			namespace = ""
		}
	}
	return namespace, pod
}

// livePods is the kubelet's list of the node's pods; known is false when
// there is none to ask or it did not answer.
type livePods struct {
	known bool
	pods  map[podRef]bool
}

func (c *RankCollector) livePods() *livePods {
	if c.o.Pods == nil {
		return &livePods{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.o.PodLookupTimeout)
	defer cancel()
	resp, err := c.o.Pods.List(ctx)
	if err != nil {
		c.errors.Inc()
		c.o.Logger.V(2).Info("pod resources lookup failed; owner records are taken as they are", "err", err.Error())
		return &livePods{}
	}
	l := &livePods{known: true, pods: map[podRef]bool{}}
	for _, p := range resp.GetPodResources() {
		l.pods[podRef{namespace: p.GetNamespace(), name: p.GetName()}] = true
	}
	return l
}

// groupOwners maps the group keys of shm to the pods their owner records
// name, less those the kubelet knows to be gone. The records are
// untrusted input: one that cannot be read or decoded counts as a read
// error and names nobody.
func (c *RankCollector) groupOwners(shm string, live *livePods) groupPods {
	dir := contract.OwnersDir(shm)
	names, err := group.ListOwners(dir)
	if err != nil {
		c.errors.Inc()
		c.o.Logger.V(2).Info("owner records unreadable; ranks go without pod labels", "err", err.Error())
		return nil
	}
	out := groupPods{}
	for key, files := range names {
		if len(files) > maxGroupOwners {
			c.errors.Add(float64(len(files) - maxGroupOwners))
			files = files[:maxGroupOwners]
		}
		for _, f := range files {
			o, err := group.ReadOwner(filepath.Join(dir, f))
			if err != nil {
				c.errors.Inc()
				c.o.Logger.V(2).Info("owner record left out", "err", err.Error())
				continue
			}
			for _, name := range o.Pods {
				ref := podRef{namespace: o.Namespace, name: name}
				if live.known && !live.pods[ref] {
					continue
				}
				if !slices.Contains(out[key], ref) {
					out[key] = append(out[key], ref)
				}
			}
		}
	}
	return out
}

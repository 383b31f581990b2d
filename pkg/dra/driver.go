// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/pxn-project/pxn/pkg/contract"
	"github.com/pxn-project/pxn/pkg/group"
	"github.com/pxn-project/pxn/pkg/nodestate"
)

// DriverName is the DRA driver's name, in DeviceClasses, ResourceSlices and
// allocation results.
const DriverName = "pxn.io"

// DeviceName is the node's one relay device, which every claim on the node
// shares.
const DeviceName = "relay"

// StateSource reports the node's rail state; nodestate.Monitor is one.
type StateSource interface {
	State() (nodestate.NodeState, <-chan struct{})
}

// Config describes the driver on one node.
type Config struct {
	// NodeName is the node's name, and the name of its device pool.
	NodeName string
	// Member is what every container of a claim gets beside its folder.
	Member group.Member
	// ShmDir is the host tmpfs folder whose groups folder
	// (contract.GroupsDir) holds the group folders.
	ShmDir string
	// CDIDir is the folder the container runtime reads CDI specs from.
	CDIDir string
	// StateDir holds the checkpoint.
	StateDir string
	// Pods reads the pod a claim made for an extended resource request is
	// reserved for, for its group label; nil: such claims are groups of
	// their own.
	Pods corev1client.PodsGetter
	// Version is the driver's version, published as the device's version
	// attribute when it is a semantic version.
	Version string
	// Logger receives a line per prepared and unprepared claim; the zero
	// Logger discards them.
	Logger klog.Logger
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if c.NodeName == "" {
		return errors.New("node name is empty")
	}
	if err := c.Member.Validate(); err != nil {
		return err
	}
	for name, dir := range map[string]string{"shm": c.ShmDir, "CDI": c.CDIDir, "state": c.StateDir} {
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("%s folder %q is not an absolute path", name, dir)
		}
	}
	return nil
}

// Driver is the kubelet plugin's logic: it prepares and unprepares claims
// and reports the relay device's health. Its methods are safe for
// concurrent use.
type Driver struct {
	cfg       Config
	state     StateSource
	groupsDir string
	ownersDir string
	keys      *group.Keyer

	mu       sync.Mutex
	prepared map[types.UID]preparedClaim

	fatal  context.CancelCauseFunc
	helper atomic.Pointer[kubeletplugin.Helper]

	// taintsDropped is set once the API server dropped a rail device's
	// taint (its DRADeviceTaints feature is off): from then on an
	// unhealthy rail device leaves the slice instead. republish wakes
	// Serve to publish again.
	taintsDropped atomic.Bool
	republish     chan struct{}
}

// New returns a driver with the claims its checkpoint records as prepared.
// It creates the folders it owns and checks that nobody else can write to
// those group folders are created and removed in; the folders of group
// folders and owner records are closed to everyone else. It reads the
// secret group keys are made with, or makes it on a first start.
func New(cfg Config, state StateSource) (*Driver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Driver{cfg: cfg, state: state, groupsDir: contract.GroupsDir(cfg.ShmDir), ownersDir: contract.OwnersDir(cfg.ShmDir),
		republish: make(chan struct{}, 1)}
	if err := group.MakePrivateDirs(cfg.StateDir, cfg.ShmDir); err != nil {
		return nil, err
	}
	if err := group.MakeClosedDirs(d.groupsDir, d.ownersDir); err != nil {
		return nil, err
	}
	keys, err := group.LoadKeyer(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	d.keys = keys
	if err := os.MkdirAll(cfg.CDIDir, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI folder %s: %w", cfg.CDIDir, err)
	}
	prepared, err := loadCheckpoint(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	d.prepared = prepared
	return d, nil
}

// PrepareResourceClaims prepares each claim as one group. A claim prepared
// before, by this process or one before it, gets the same answer; its folder
// and spec are made again when missing. A new claim is written to the
// checkpoint before its folder and spec are made: when the checkpoint
// cannot be written, nothing is made and the claim's Prepare fails.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	answer := func(claim *resourceapi.ResourceClaim, pc preparedClaim, err error) {
		if err != nil {
			d.cfg.Logger.Info("Claim not prepared", "claim", klog.KObj(claim), "uid", claim.UID, "err", err.Error())
			results[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)}
			return
		}
		results[claim.UID] = kubeletplugin.PrepareResult{Devices: pc.result(claim.UID)}
	}
	type fresh struct {
		claim *resourceapi.ResourceClaim
		pc    preparedClaim
	}
	var news []fresh
	for _, claim := range claims {
		if pc, ok := d.prepared[claim.UID]; ok {
			answer(claim, pc, d.materialize(claim, pc))
			continue
		}
		pc, err := d.plan(ctx, claim)
		if err != nil {
			answer(claim, pc, err)
			continue
		}
		news = append(news, fresh{claim, pc})
	}
	if len(news) == 0 {
		return results, nil
	}
	// The checkpoint holds a claim before anything of it exists on the
	// node, so that whatever Prepare makes, an Unprepare after a restart
	// finds and removes; memory follows the checkpoint, never leads it.
	next := maps.Clone(d.prepared)
	for _, f := range news {
		next[f.claim.UID] = f.pc
	}
	if err := saveCheckpoint(d.cfg.StateDir, next); err != nil {
		for _, f := range news {
			answer(f.claim, f.pc, err)
		}
		return results, nil
	}
	d.prepared = next
	for _, f := range news {
		err := d.materialize(f.claim, f.pc)
		if err == nil {
			d.cfg.Logger.Info("Prepared claim", "claim", klog.KObj(f.claim), "uid", f.claim.UID, "group", f.pc.Group, "adminAccess", f.pc.Group == "")
		}
		answer(f.claim, f.pc, err)
	}
	return results, nil
}

// plan decides what a claim not yet prepared gets: its devices, its group
// and its container edits. It makes nothing on the node.
func (d *Driver) plan(ctx context.Context, claim *resourceapi.ResourceClaim) (preparedClaim, error) {
	if claim.Status.Allocation == nil {
		return preparedClaim{}, errors.New("not allocated")
	}
	alloc := claim.Status.Allocation.Devices
	st, _ := d.state.State()
	var devs []preparedDevice
	var rails []allocatedHCA
	admin, user := 0, 0
	for _, r := range alloc.Results {
		if r.Driver != DriverName {
			continue
		}
		if r.Pool != d.cfg.NodeName || r.Device != DeviceName && !strings.HasPrefix(r.Device, railDevicePrefix) {
			return preparedClaim{}, fmt.Errorf("request %s was allocated device %s/%s, not this node's %s/%s or one of its rail devices", r.Request, r.Pool, r.Device, d.cfg.NodeName, DeviceName)
		}
		if r.AdminAccess != nil && *r.AdminAccess {
			admin++
		} else {
			user++
			if r.Device != DeviceName {
				rails = append(rails, allocatedHCA{request: r.Request, device: r.Device})
			}
		}
		devs = append(devs, preparedDevice{Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device, ShareID: r.ShareID})
	}
	if admin > 0 && user > 0 {
		return preparedClaim{}, fmt.Errorf("%d requests with admin access and %d without: a claim is a group or a diagnosis, not both", admin, user)
	}
	if err := checkConfigs(alloc.Config); err != nil {
		return preparedClaim{}, err
	}
	if err := checkClaimUID(claim.UID); err != nil {
		return preparedClaim{}, err
	}
	pc := preparedClaim{Namespace: claim.Namespace, Name: claim.Name, Devices: devs}
	if admin > 0 {
		pc.Edits = edits{Mount: group.Mount{HostPath: d.groupsDir, ContainerPath: d.cfg.Member.RegistryRoot, ReadOnly: true}}
		return pc, nil
	}
	if err := ready(d.cfg.NodeName, st); err != nil {
		return preparedClaim{}, err
	}
	for i, a := range rails {
		h, err := railHCA(d.cfg.NodeName, st, a.device)
		if err != nil {
			return preparedClaim{}, fmt.Errorf("request %s: %w", a.request, err)
		}
		rails[i].hca = h
	}
	var err error
	if pc.Group, err = d.groupKey(ctx, claim); err != nil {
		return preparedClaim{}, err
	}
	env := d.cfg.Member.Env(st.RailMap)
	maps.Copy(env, railEnv(st.Layout, rails))
	pc.Edits = edits{Env: env, Mount: d.cfg.Member.Mount(filepath.Join(d.groupsDir, pc.Group))}
	return pc, nil
}

// groupKey is the claim's group: its own, keyed by its UID; or, for a claim
// the scheduler made for a pod's extended resource request (a DeviceClass
// with extendedResourceName), the pod's group label's when it has one, keyed
// as the device plugin keys it, so that the pods of one job still meet when
// they move from the device plugin to the driver unchanged. A pod that
// cannot be read fails the prepare rather than put a rank in another folder
// than its job's.
func (d *Driver) groupKey(ctx context.Context, claim *resourceapi.ResourceClaim) (string, error) {
	own := func() (string, error) {
		return d.keys.FolderKey(d.groupsDir, claim.Namespace, group.SourceClaim, string(claim.UID))
	}
	if claim.Annotations[resourceapi.ExtendedResourceClaimAnnotation] != "true" || d.cfg.Pods == nil {
		return own()
	}
	var pods []resourceapi.ResourceClaimConsumerReference
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" {
			pods = append(pods, r)
		}
	}
	if len(pods) != 1 {
		return "", fmt.Errorf("a claim for an extended resource is reserved for %d pods, want 1", len(pods))
	}
	ref := pods[0]
	pod, err := d.cfg.Pods.Pods(claim.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read pod %s/%s for its %s label: %w", claim.Namespace, ref.Name, group.Label, err)
	}
	if pod.UID != ref.UID {
		return "", fmt.Errorf("pod %s/%s has UID %s; the claim is reserved for UID %s", claim.Namespace, ref.Name, pod.UID, ref.UID)
	}
	if g := pod.Labels[group.Label]; g != "" {
		return d.keys.FolderKey(d.groupsDir, claim.Namespace, group.SourceLabel, g)
	}
	return own()
}

// ready reports why a node's rails cannot serve a new group, or nil.
func ready(node string, st nodestate.NodeState) error {
	switch {
	case !st.Discovered:
		return fmt.Errorf("rails on node %s are not discovered yet", node)
	case st.Err != nil:
		return fmt.Errorf("rail discovery on node %s failed: %w", node, st.Err)
	case !st.Healthy:
		return fmt.Errorf("rails on node %s are not ready: %s", node, st.Summary.Detail)
	}
	return nil
}

// materialize makes a prepared claim's group folder and CDI spec, and
// records the claim and the pods it is reserved for now as owners of the
// folder. A record that cannot be written fails nothing: it names pods for
// the agent's metrics only, and the next prepare of the claim writes it
// again.
func (d *Driver) materialize(claim *resourceapi.ResourceClaim, pc preparedClaim) error {
	if pc.Group != "" {
		if err := group.EnsureDir(filepath.Join(d.groupsDir, pc.Group)); err != nil {
			return err
		}
		if err := group.WriteOwner(d.ownersDir, pc.Group, claimOwnerID(claim.UID), claimOwner(claim)); err != nil {
			d.cfg.Logger.Error(err, "Owner record not written", "claim", klog.KObj(claim), "group", pc.Group)
		}
	}
	return writeCDISpec(d.cfg.CDIDir, claim.UID, pc.Edits)
}

// claimOwnerID is the owner ID of a claim's record.
func claimOwnerID(uid types.UID) string { return group.OwnerClaimPrefix + string(uid) }

// claimOwner is the claim and the pods it is reserved for.
func claimOwner(claim *resourceapi.ResourceClaim) group.Owner {
	o := group.Owner{Namespace: claim.Namespace, Claim: claim.Name, Pods: []string{}}
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" && len(o.Pods) < group.MaxOwnerPods {
			o.Pods = append(o.Pods, r.Name)
		}
	}
	return o
}

// UnprepareResourceClaims removes each claim's CDI spec and group folder.
// A claim the checkpoint does not hold was never prepared here or is
// already gone: nothing to do. A claim leaves memory only once the
// checkpoint no longer holds it: when the checkpoint cannot be written, its
// Unprepare fails and the kubelet's next try removes it again.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	results := make(map[types.UID]error, len(claims))
	leaving := map[types.UID]bool{}
	var gone []kubeletplugin.NamespacedObject
	for _, c := range claims {
		pc, ok := d.prepared[c.UID]
		if !ok {
			results[c.UID] = nil
			continue
		}
		if err := d.unprepare(c.UID, pc, leaving); err != nil {
			results[c.UID] = fmt.Errorf("claim %s: %w", c, err)
			continue
		}
		leaving[c.UID] = true
		gone = append(gone, c)
	}
	if len(gone) == 0 {
		return results, nil
	}
	next := maps.Clone(d.prepared)
	for uid := range leaving {
		delete(next, uid)
	}
	if err := saveCheckpoint(d.cfg.StateDir, next); err != nil {
		for _, c := range gone {
			results[c.UID] = fmt.Errorf("claim %s: %w", c, err)
		}
		return results, nil
	}
	for _, c := range gone {
		d.cfg.Logger.Info("Unprepared claim", "claim", c, "group", d.prepared[c.UID].Group)
		results[c.UID] = nil
	}
	d.prepared = next
	return results, nil
}

// unprepare removes a claim's CDI spec, its owner record and, unless a
// claim that is not leaving shares it, its group folder.
func (d *Driver) unprepare(uid types.UID, pc preparedClaim, leaving map[types.UID]bool) error {
	if err := removeCDISpec(d.cfg.CDIDir, uid); err != nil {
		return err
	}
	if pc.Group == "" {
		return nil
	}
	if err := group.RemoveOwner(d.ownersDir, pc.Group, claimOwnerID(uid)); err != nil {
		return err
	}
	for other, o := range d.prepared {
		if other != uid && !leaving[other] && o.Group == pc.Group {
			return nil // another claim's pods (one job, by label) still use it
		}
	}
	if !contract.IsGroupKey(pc.Group) {
		return fmt.Errorf("checkpoint names group %q, not a group key", pc.Group)
	}
	root, err := os.OpenRoot(d.groupsDir)
	if err != nil {
		return fmt.Errorf("open groups %s: %w", d.groupsDir, err)
	}
	defer root.Close()
	// Root confines the removal to the groups folder: links inside a group
	// folder are removed, never followed.
	if err := root.RemoveAll(pc.Group); err != nil {
		return fmt.Errorf("remove group %s: %w", filepath.Join(d.groupsDir, pc.Group), err)
	}
	return nil
}

// Prepared returns the UIDs of the claims prepared on the node.
func (d *Driver) Prepared() []types.UID {
	d.mu.Lock()
	defer d.mu.Unlock()
	uids := make([]types.UID, 0, len(d.prepared))
	for uid := range d.prepared {
		uids = append(uids, uid)
	}
	return uids
}

// HandleError logs a background error of the kubelet plugin helper; a fatal
// one stops Serve. When the API server dropped the rail devices' taints,
// the driver publishes again with unhealthy rail devices left out.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	d.cfg.Logger.Error(err, msg, "recoverable", errors.Is(err, kubeletplugin.ErrRecoverable))
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) && slices.Contains(dropped.DisabledFeatures(), "DRADeviceTaints") && !d.taintsDropped.Swap(true) {
		d.cfg.Logger.Info("The API server drops device taints; rail devices whose port is down leave the slice instead", "node", d.cfg.NodeName)
		select {
		case d.republish <- struct{}{}:
		default:
		}
	}
	if !errors.Is(err, kubeletplugin.ErrRecoverable) && d.fatal != nil {
		d.fatal(fmt.Errorf("%s: %w", msg, err))
	}
}

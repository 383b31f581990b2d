// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
)

// reconciler makes the node's PxnRailMap and labels match the latest
// discovery. It reads only from the informer cache and writes only what
// differs from it.
type reconciler struct {
	node         string
	agentVersion string
	reader       client.Reader // the informer cache
	writer       client.Client
	state        interface{ snapshot() (*Discovery, error) }
	metrics      *metrics
	events       events.EventRecorder
	log          klog.Logger

	synced atomic.Bool
}

func (r *reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	if err := r.sync(ctx); err != nil {
		r.metrics.errors.WithLabelValues("publish").Inc()
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, nil
}

func (r *reconciler) sync(ctx context.Context) error {
	d, discErr := r.state.snapshot()
	if d == nil && discErr == nil {
		return nil // the discovery loop wakes us when it has a result
	}
	node := &corev1.Node{}
	var err error
	if err = r.reader.Get(ctx, types.NamespacedName{Name: r.node}, node); err != nil {
		if apierrors.IsNotFound(err) {
			r.log.Info("node not found, waiting for it")
			return nil // the node watch wakes us when it appears
		}
		return fmt.Errorf("get node %s from cache: %w", r.node, err)
	}
	var all pxnv1alpha1.PxnRailMapList
	if err = r.reader.List(ctx, &all, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list PxnRailMaps from cache: %w", err)
	}
	var existing *pxnv1alpha1.PxnRailMap
	for i := range all.Items {
		if all.Items[i].Name == r.node {
			existing = &all.Items[i]
			break
		}
	}

	rv := ""
	if existing != nil {
		rv = existing.ResourceVersion
	}
	if existing == nil || !ownedBy(existing, node) || existing.Spec.NodeName != r.node {
		if rv, err = r.applyMap(ctx, node, rv); err != nil {
			return err
		}
	}
	status := r.desiredStatus(d, discErr, all.Items, existing)
	if existing == nil || !equality.Semantic.DeepEqual(existing.Status, status) {
		applied, err := r.applyStatus(ctx, status, rv)
		if err != nil {
			return err
		}
		var old []metav1.Condition
		if existing != nil {
			old = existing.Status.Conditions
		}
		recordConditionChanges(r.events, node, applied, old, status.Conditions)
	}
	for _, typ := range []string{pxnv1alpha1.ConditionReady, pxnv1alpha1.ConditionConsistent} {
		v := 0.0
		if meta.IsStatusConditionTrue(status.Conditions, typ) {
			v = 1
		}
		r.metrics.conditions.WithLabelValues(typ).Set(v)
	}
	if err := r.applyLabels(ctx, node, status); err != nil {
		return err
	}
	r.synced.Store(true)
	return nil
}

// ownedBy reports whether the map's only Node owner is node, with its
// current UID.
func ownedBy(m *pxnv1alpha1.PxnRailMap, node *corev1.Node) bool {
	found := false
	for _, ref := range m.OwnerReferences {
		if ref.Kind != "Node" || ref.APIVersion != "v1" {
			continue
		}
		if ref.UID != node.UID || ref.Name != node.Name {
			return false
		}
		found = true
	}
	return found
}

func (r *reconciler) desiredStatus(d *Discovery, discErr error, all []pxnv1alpha1.PxnRailMap, existing *pxnv1alpha1.PxnRailMap) pxnv1alpha1.PxnRailMapStatus {
	var s pxnv1alpha1.PxnRailMapStatus
	if d != nil {
		d.Layout.DeepCopyInto(&s.RailLayout)
	}
	s.GPUCount = int32(len(s.GPUs))
	s.HCACount = int32(len(s.HCAs))
	s.AgentVersion = r.agentVersion
	consistent := consistentCondition(r.node, s.RailMap, all)
	if d == nil {
		consistent = metav1.Condition{Type: pxnv1alpha1.ConditionConsistent, Status: metav1.ConditionUnknown,
			Reason: ReasonDiscoveryFailed, Message: "no discovery has completed yet"}
	}
	s.Conditions = []metav1.Condition{readyCondition(d, discErr), consistent}
	var old []metav1.Condition
	if existing != nil {
		old = existing.Status.Conditions
	}
	keepTransitionTimes(s.Conditions, old, metav1.NewTime(time.Now().Truncate(time.Second)))
	return s
}

// applyMap applies the map's owner and spec and returns the map's new
// resourceVersion; rv is the one the cache had.
func (r *reconciler) applyMap(ctx context.Context, node *corev1.Node, rv string) (string, error) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": pxnv1alpha1.GroupVersion.String(),
		"kind":       "PxnRailMap",
		"metadata": map[string]any{
			"name": r.node,
			"ownerReferences": []any{map[string]any{
				"apiVersion": "v1",
				"kind":       "Node",
				"name":       node.Name,
				"uid":        string(node.UID),
			}},
		},
		"spec": map[string]any{"nodeName": r.node},
	}}
	if err := r.writer.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return "", fmt.Errorf("apply PxnRailMap %s: %w", r.node, err)
	}
	r.metrics.publishes.WithLabelValues("map").Inc()
	r.log.Info("applied PxnRailMap", "prm", klog.KRef("", r.node), "owner", klog.KObj(node), "ownerUID", node.UID)
	r.awaitCache(ctx, &pxnv1alpha1.PxnRailMap{}, r.node, rv, u.GetResourceVersion())
	return u.GetResourceVersion(), nil
}

// applyStatus applies the map's status and returns the map as the API
// server answered.
func (r *reconciler) applyStatus(ctx context.Context, s pxnv1alpha1.PxnRailMapStatus, rv string) (*unstructured.Unstructured, error) {
	status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&s)
	if err != nil {
		return nil, fmt.Errorf("convert status of PxnRailMap %s: %w", r.node, err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": pxnv1alpha1.GroupVersion.String(),
		"kind":       "PxnRailMap",
		"metadata":   map[string]any{"name": r.node},
		"status":     status,
	}}
	if err := r.writer.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return nil, fmt.Errorf("apply status of PxnRailMap %s: %w", r.node, err)
	}
	r.metrics.publishes.WithLabelValues("status").Inc()
	r.awaitCache(ctx, &pxnv1alpha1.PxnRailMap{}, r.node, rv, u.GetResourceVersion())
	ready := meta.FindStatusCondition(s.Conditions, pxnv1alpha1.ConditionReady)
	consistent := meta.FindStatusCondition(s.Conditions, pxnv1alpha1.ConditionConsistent)
	r.log.Info("published", "prm", klog.KRef("", r.node), "rails", s.Rails, "gpus", s.GPUCount, "hcas", s.HCACount,
		"ready", ready.Status, "readyReason", ready.Reason, "consistent", consistent.Status, "consistentReason", consistent.Reason)
	return u, nil
}

// applyLabels sets pxn.io/capable and pxn.io/rails on the node when they
// differ. A merge patch, not an apply: an apply would re-create a Node that
// was deleted a moment ago.
func (r *reconciler) applyLabels(ctx context.Context, node *corev1.Node, s pxnv1alpha1.PxnRailMapStatus) error {
	want := map[string]string{
		pxnv1alpha1.LabelCapable: strconv.FormatBool(capable(s)),
		pxnv1alpha1.LabelRails:   strconv.Itoa(int(s.Rails)),
	}
	patch := map[string]any{}
	for k, v := range want {
		if got, ok := node.Labels[k]; !ok || got != v {
			patch[k] = v
		}
	}
	if len(patch) == 0 {
		return nil
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": patch}})
	if err != nil {
		return err
	}
	patched := node.DeepCopy()
	if err := r.writer.Patch(ctx, patched, client.RawPatch(types.MergePatchType, body), client.FieldOwner(FieldManager)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil // deleted since the cache saw it; its re-creation wakes us
		}
		return fmt.Errorf("label node %s: %w", node.Name, err)
	}
	r.metrics.publishes.WithLabelValues("node-labels").Inc()
	r.awaitCache(ctx, &corev1.Node{}, node.Name, node.ResourceVersion, patched.ResourceVersion)
	r.log.Info("labelled node", "labels", want)
	return nil
}

// awaitCache waits, for a few seconds at most, until the cache shows obj
// past resourceVersion before (the one it had when it was written; after is
// the one the write returned). The controller's single worker then compares
// its next sync with what was just written instead of writing it again.
func (r *reconciler) awaitCache(ctx context.Context, obj client.Object, name, before, after string) {
	if before == after {
		return
	}
	key := types.NamespacedName{Name: name}
	err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := r.reader.Get(ctx, key, obj); err != nil {
			return false, nil
		}
		return obj.GetResourceVersion() != before, nil
	})
	if err != nil {
		r.log.V(2).Info("cache did not catch up with a write", "kind", fmt.Sprintf("%T", obj), "name", name, "err", err)
	}
}

// capable is true when the node has GPUs and rails and every railed port is
// ACTIVE: the node can relay.
func capable(s pxnv1alpha1.PxnRailMapStatus) bool {
	return s.Rails > 0 && s.GPUCount > 0 && meta.IsStatusConditionTrue(s.Conditions, pxnv1alpha1.ConditionReady)
}

// published is the readiness check: ready once the node's map and labels
// have been brought up to date once.
func (r *reconciler) published(_ *http.Request) error {
	if !r.synced.Load() {
		return errors.New("the node's PxnRailMap has not been published yet")
	}
	return nil
}

// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"maps"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
)

type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]

// watch feeds the controller's single key, the node, from three sources: the
// node's own Node object, every PxnRailMap (the own one always, the others
// when their rail map changes, since only that affects consistency), and the
// discovery loop.
func watch(c controller.Controller, ca cache.Cache, node string, discovered <-chan event.TypedGenericEvent[struct{}]) error {
	req := reconcile.Request{NamespacedName: types.NamespacedName{Name: node}}
	enqueue := func(q queue) { q.Add(req) }

	nodes := handler.TypedFuncs[*corev1.Node, reconcile.Request]{
		CreateFunc: func(_ context.Context, _ event.TypedCreateEvent[*corev1.Node], q queue) { enqueue(q) },
		DeleteFunc: func(_ context.Context, _ event.TypedDeleteEvent[*corev1.Node], q queue) { enqueue(q) },
		UpdateFunc: func(_ context.Context, e event.TypedUpdateEvent[*corev1.Node], q queue) {
			if e.ObjectOld.UID != e.ObjectNew.UID || !maps.Equal(e.ObjectOld.Labels, e.ObjectNew.Labels) {
				enqueue(q)
			}
		},
	}
	if err := c.Watch(source.Kind(ca, &corev1.Node{}, nodes)); err != nil {
		return err
	}

	railMaps := handler.TypedFuncs[*pxnv1alpha1.PxnRailMap, reconcile.Request]{
		CreateFunc: func(_ context.Context, e event.TypedCreateEvent[*pxnv1alpha1.PxnRailMap], q queue) {
			if e.Object.Name == node || len(e.Object.Status.RailMap) > 0 {
				enqueue(q)
			}
		},
		DeleteFunc: func(_ context.Context, e event.TypedDeleteEvent[*pxnv1alpha1.PxnRailMap], q queue) {
			if e.Object.Name == node || len(e.Object.Status.RailMap) > 0 {
				enqueue(q)
			}
		},
		UpdateFunc: func(_ context.Context, e event.TypedUpdateEvent[*pxnv1alpha1.PxnRailMap], q queue) {
			if e.ObjectNew.Name == node || !maps.Equal(e.ObjectOld.Status.RailMap, e.ObjectNew.Status.RailMap) {
				enqueue(q)
			}
		},
	}
	if err := c.Watch(source.Kind(ca, &pxnv1alpha1.PxnRailMap{}, railMaps)); err != nil {
		return err
	}

	wake := handler.TypedFuncs[struct{}, reconcile.Request]{
		GenericFunc: func(_ context.Context, _ event.TypedGenericEvent[struct{}], q queue) { enqueue(q) },
	}
	return c.Watch(source.TypedChannel(discovered, wake))
}

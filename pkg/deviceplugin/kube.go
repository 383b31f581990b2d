// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

type clientPods struct{ client kubernetes.Interface }

// NewClientPodGetter reads pods through client.
func NewClientPodGetter(client kubernetes.Interface) PodGetter { return clientPods{client} }

func (c clientPods) Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return c.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}

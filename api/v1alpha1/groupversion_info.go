// SPDX-License-Identifier: Apache-2.0

// Package v1alpha1 holds the pxn.io/v1alpha1 API: PxnRailMap, the per-node
// record of GPUs, HCAs and canonical rails that pxn-agent publishes.
//
// +kubebuilder:object:generate=true
// +groupName=pxn.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "pxn.io", Version: "v1alpha1"}

	// SchemeBuilder registers this package's types with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this package's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &PxnRailMap{}, &PxnRailMapList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

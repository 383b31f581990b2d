// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types of a PxnRailMap.
const (
	// ConditionReady is True when every port of every HCA on a rail is ACTIVE.
	ConditionReady = "Ready"
	// ConditionConsistent is True when every HCA name of this node maps to the
	// same rail on every other node that has an HCA of that name.
	ConditionConsistent = "Consistent"
)

// Node labels written by pxn-agent.
const (
	// LabelCapable is "true" on a node whose rails PXN can use, else "false".
	LabelCapable = "pxn.io/capable"
	// LabelRails is the node's number of canonical rails.
	LabelRails = "pxn.io/rails"
)

// PxnRailMapSpec names the node a map describes. The map's name is the node's
// name as well.
type PxnRailMapSpec struct {
	// NodeName is the name of the Node this map describes.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName"`
}

// GPU is one GPU of the node and the HCA nearest to it.
type GPU struct {
	// Index is the GPU's position in PCI bus order.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1023
	Index int32 `json:"index"`
	// UUID is the GPU's NVML UUID.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	UUID string `json:"uuid,omitempty"`
	// Name is the GPU's product name from NVML, e.g. NVIDIA H200.
	// +kubebuilder:validation:MaxLength=96
	// +optional
	Name string `json:"name,omitempty"`
	// PCIBusID is the normalized PCI address, domain:bus:device.function.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=32
	PCIBusID string `json:"pciBusID"`
	// NUMANode is the GPU's NUMA node, -1 when the platform reports none.
	// +kubebuilder:validation:Minimum=-1
	NUMANode int32 `json:"numaNode"`
	// HCA is the name of the HCA nearest to this GPU.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	HCA string `json:"hca,omitempty"`
	// Distance is the PCIe distance class between the GPU and its HCA.
	// +kubebuilder:validation:Enum=PIX;PXB;PHB;NODE;SYS
	// +optional
	Distance string `json:"distance,omitempty"`
	// Rail is the canonical rail of the GPU's HCA: 1 to 48 letters, digits
	// and _ . : / - (the engine's rail-name rule).
	// +kubebuilder:validation:MaxLength=48
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.:/-]{1,48}$`
	// +optional
	Rail string `json:"rail,omitempty"`
}

// HCA is one RDMA device of the node, its first port's state and its rail.
type HCA struct {
	// Name is the raw device name under /sys/class/infiniband.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	Name string `json:"name"`
	// PCIBusID is the normalized PCI address, domain:bus:device.function.
	// +kubebuilder:validation:MaxLength=32
	PCIBusID string `json:"pciBusID"`
	// NUMANode is the HCA's NUMA node, -1 when the platform reports none.
	// +kubebuilder:validation:Minimum=-1
	NUMANode int32 `json:"numaNode"`
	// LinkLayer is InfiniBand or Ethernet (RoCE).
	// +kubebuilder:validation:MaxLength=32
	LinkLayer string `json:"linkLayer"`
	// State is the port state, e.g. ACTIVE or DOWN.
	// +kubebuilder:validation:MaxLength=32
	State string `json:"state"`
	// PhysState is the physical port state, e.g. LinkUp or Disabled.
	// +kubebuilder:validation:MaxLength=32
	PhysState string `json:"physState"`
	// Rate is the port rate as sysfs reports it, e.g. "400 Gb/sec (4X NDR)".
	// +kubebuilder:validation:MaxLength=64
	Rate string `json:"rate"`
	// Netdev is the network interface of a RoCE port.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Netdev string `json:"netdev,omitempty"`
	// Rail is the HCA's canonical rail, empty when the HCA is on no rail: 1 to
	// 48 letters, digits and _ . : / - (the engine's rail-name rule).
	// +kubebuilder:validation:MaxLength=48
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.:/-]{1,48}$`
	// +optional
	Rail string `json:"rail,omitempty"`
	// Port is the number of the port the other fields describe; 0 when the
	// HCA shows no port.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=255
	// +optional
	Port int32 `json:"port"`
}

// Pair is the PCIe distance class between one GPU and one HCA.
type Pair struct {
	// GPU is the GPU's index.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1023
	GPU int32 `json:"gpu"`
	// HCA is the HCA's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	HCA string `json:"hca"`
	// Distance is PIX (same PCIe switch), PXB (several switches), PHB (the
	// host bridge), NODE (same NUMA node) or SYS (across NUMA nodes).
	// +kubebuilder:validation:Enum=PIX;PXB;PHB;NODE;SYS
	Distance string `json:"distance"`
}

// RailLayout is what rail discovery found on the node. Its JSON is the same as
// the output of `pxn-agent discover`.
type RailLayout struct {
	// GPUs in PCI bus order.
	// +kubebuilder:validation:MaxItems=1024
	// +listType=atomic
	// +optional
	GPUs []GPU `json:"gpus,omitempty"`
	// HCAs sorted by name.
	// +kubebuilder:validation:MaxItems=1024
	// +listType=atomic
	// +optional
	HCAs []HCA `json:"hcas,omitempty"`
	// RailMap maps each raw HCA name to its canonical rail; it is the value of
	// MC_PXN_RAIL_MAP on this node.
	// +kubebuilder:validation:MaxProperties=1024
	// +optional
	RailMap map[string]string `json:"railMap,omitempty"`
	// Rails is the number of distinct canonical rails.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1024
	Rails int32 `json:"rails"`
	// Strategy is the rail strategy that produced RailMap.
	// +kubebuilder:validation:Enum=pci-order;subnet;static
	// +optional
	Strategy string `json:"strategy,omitempty"`
	// GPUSource says where the GPUs came from: nvml or a sysfs scan.
	// +kubebuilder:validation:Enum=nvml;sysfs
	// +optional
	GPUSource string `json:"gpuSource,omitempty"`
	// Pairs is every GPU/HCA pair with a known distance class.
	// +kubebuilder:validation:MaxItems=16384
	// +listType=atomic
	// +optional
	Pairs []Pair `json:"pairs,omitempty"`
}

// PxnRailMapStatus is the node's discovered layout and the agent's verdict on it.
type PxnRailMapStatus struct {
	RailLayout `json:",inline"`

	// GPUCount is len(gpus); it exists for the GPUS printer column.
	// +kubebuilder:validation:Minimum=0
	// +optional
	GPUCount int32 `json:"gpuCount"`
	// HCACount is len(hcas); it exists for the HCAS printer column.
	// +kubebuilder:validation:Minimum=0
	// +optional
	HCACount int32 `json:"hcaCount"`

	// Conditions: Ready and Consistent.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// AgentVersion is the version of the pxn-agent that wrote this status.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	AgentVersion string `json:"agentVersion,omitempty"`
}

// PxnRailMap is one node's GPUs, HCAs and canonical rails, published by the
// pxn-agent on that node. It is named after its Node and owned by it.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=prm
// +kubebuilder:printcolumn:name="Rails",type=integer,JSONPath=`.status.rails`
// +kubebuilder:printcolumn:name="GPUs",type=integer,JSONPath=`.status.gpuCount`
// +kubebuilder:printcolumn:name="HCAs",type=integer,JSONPath=`.status.hcaCount`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Consistent",type=string,JSONPath=`.status.conditions[?(@.type=="Consistent")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type PxnRailMap struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec PxnRailMapSpec `json:"spec,omitempty"`
	// +optional
	Status PxnRailMapStatus `json:"status,omitempty"`
}

// PxnRailMapList is a list of PxnRailMap.
//
// +kubebuilder:object:root=true
type PxnRailMapList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PxnRailMap `json:"items"`
}

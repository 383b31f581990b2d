// SPDX-License-Identifier: Apache-2.0

package dra

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pxn-project/pxn/pkg/nodestate"
	"github.com/pxn-project/pxn/pkg/rail"
)

// The environment a container of a claim with rail devices gets beside
// the engine's, naming the claim's HCAs in the forms serving frameworks
// read. A claim without rail devices gets none of them.
const (
	// EnvHCA is the claim's HCAs, comma-separated in PCI bus order:
	// Mooncake's device_name (initialize's whitelist) and SGLang's plain
	// --disaggregation-ib-device.
	EnvHCA = "PXN_HCA"
	// EnvRail is the canonical rail of each HCA of EnvHCA, in its order.
	EnvRail = "PXN_RAIL"
	// EnvSGLangIBDevice is SGLang's per-GPU --disaggregation-ib-device
	// map, {"0":"mlx5_0","1":"mlx5_2"}: the container's GPU ordinal, its
	// GPUs counted in PCI bus order, to the HCA on that GPU's PCIe root.
	EnvSGLangIBDevice = "PXN_SGLANG_IB_DEVICE"
	// EnvVLLMGPUNICMapping is vLLM's VLLM_GPU_NIC_PCIE_MAPPING form,
	// GPU_BDF=NIC_BDF pairs separated by commas. It is not vLLM's own
	// variable because vLLM refuses it without VLLM_NIC_SELECTION_VARS,
	// which only the user can choose.
	EnvVLLMGPUNICMapping = "PXN_VLLM_GPU_NIC_PCIE_MAPPING"
)

// allocatedHCA is the HCA of a rail device a claim was allocated, once per
// allocation result: a device shared by two requests of one claim serves
// two GPUs.
type allocatedHCA struct {
	request string
	device  string
	hca     rail.HCA
}

// railHCA is the HCA of a node's rail device, or why a new claim cannot
// have it.
func railHCA(node string, st nodestate.NodeState, device string) (rail.HCA, error) {
	var names []string
	for _, r := range railDevices(st.Layout) {
		if r.name != device {
			names = append(names, r.name)
			continue
		}
		if why := r.unhealthy(st); why != "" {
			return rail.HCA{}, fmt.Errorf("rail device %s: HCA %s port %d is %s", device, r.hca.Name, r.hca.Port, why)
		}
		return r.hca, nil
	}
	return rail.HCA{}, fmt.Errorf("node %s has no rail device %s (it has %s)", node, device, strings.Join(names, ", "))
}

// railEnv is the environment of EnvHCA and the rest for a claim's rail
// devices. A claim's GPUs are not this driver's to see: the GPU paired with
// a rail device is taken to be a GPU on the HCA's PCIe root (what a claim
// matching resource.kubernetes.io/pcieRoot gets), else a GPU whose nearest
// HCA it is, each GPU paired once, in PCI bus order. Without such GPUs the
// per-GPU forms are left out.
func railEnv(l *rail.Layout, allocated []allocatedHCA) map[string]string {
	if len(allocated) == 0 {
		return nil
	}
	used := map[string]bool{}
	type pair struct {
		gpu rail.GPU
		hca rail.HCA
	}
	var pairs []pair
	var hcas []rail.HCA
	for _, a := range allocated {
		if !slices.ContainsFunc(hcas, func(h rail.HCA) bool { return h.Name == a.hca.Name }) {
			hcas = append(hcas, a.hca)
		}
		if g, ok := pairedGPU(l, a.hca, used); ok {
			used[g.PCIBusID] = true
			pairs = append(pairs, pair{g, a.hca})
		}
	}
	slices.SortFunc(hcas, func(a, b rail.HCA) int { return strings.Compare(a.PCIBusID, b.PCIBusID) })
	names := make([]string, len(hcas))
	rails := make([]string, len(hcas))
	for i, h := range hcas {
		names[i], rails[i] = h.Name, h.Rail
	}
	env := map[string]string{EnvHCA: strings.Join(names, ","), EnvRail: strings.Join(rails, ",")}
	if len(pairs) == 0 {
		return env
	}
	slices.SortFunc(pairs, func(a, b pair) int { return strings.Compare(a.gpu.PCIBusID, b.gpu.PCIBusID) })
	sglang := make(map[string]string, len(pairs))
	vllm := make([]string, len(pairs))
	for i, p := range pairs {
		sglang[strconv.Itoa(i)] = p.hca.Name
		vllm[i] = p.gpu.PCIBusID + "=" + p.hca.PCIBusID
	}
	js, err := json.Marshal(sglang)
	if err != nil {
		panic(fmt.Sprintf("a map of strings cannot be encoded: %v", err))
	}
	env[EnvSGLangIBDevice] = string(js)
	env[EnvVLLMGPUNICMapping] = strings.Join(vllm, ",")
	return env
}

// pairedGPU is the first GPU in bus order not yet used on the HCA's PCIe
// root, else the first whose nearest HCA it is.
func pairedGPU(l *rail.Layout, h rail.HCA, used map[string]bool) (rail.GPU, bool) {
	if l == nil {
		return rail.GPU{}, false
	}
	for _, near := range []func(rail.GPU) bool{
		func(g rail.GPU) bool { return h.PCIeRoot != "" && g.PCIeRoot == h.PCIeRoot },
		func(g rail.GPU) bool { return g.HCA == h.Name },
	} {
		for _, g := range l.GPUs {
			if !used[g.PCIBusID] && near(g) {
				return g, true
			}
		}
	}
	return rail.GPU{}, false
}

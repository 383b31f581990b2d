// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/internal/version"
)

// labelPrefix is the prefix of every node label the agent sets.
const labelPrefix = "pxn.io/"

func newRemoveLabelsCommand(ctx context.Context) *cobra.Command {
	var kubeconfig string
	cmd := &cobra.Command{
		Use:   "remove-labels",
		Short: "Remove PXN's labels (pxn.io/*) from every node",
		Long: `Removes every pxn.io/* label from every node. The chart runs it as a post-delete
hook (cleanup.removeNodeLabels); run it by hand after removing the agent
otherwise. Prints one line per node it changed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return cli.Failed(fmt.Errorf("no Kubernetes client configuration: %w", err))
			}
			cfg.UserAgent = "pxn-agent/" + version.String()
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return cli.Failed(err)
			}
			if err := removeLabels(ctx, cs, cmd.OutOrStdout()); err != nil {
				return cli.Failed(err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster or $KUBECONFIG")
	return cmd
}

// removeLabels drops the pxn.io/* labels of every node with a merge patch
// that names only those labels, so a concurrent change of other labels is
// never undone.
func removeLabels(ctx context.Context, cs kubernetes.Interface, out io.Writer) error {
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	changed := 0
	for _, n := range nodes.Items {
		drop := map[string]any{}
		var names []string
		for k := range n.Labels {
			if strings.HasPrefix(k, labelPrefix) {
				drop[k] = nil
				names = append(names, k)
			}
		}
		if len(drop) == 0 {
			continue
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": drop}})
		if err != nil {
			return err
		}
		if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("node %s: remove labels %v: %w", n.Name, names, err)
		}
		sort.Strings(names)
		fmt.Fprintf(out, "node/%s: removed %s\n", n.Name, strings.Join(names, ", "))
		changed++
	}
	fmt.Fprintf(out, "%d of %d nodes had pxn.io/* labels\n", changed, len(nodes.Items))
	return nil
}

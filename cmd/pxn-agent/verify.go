// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	pxnv1alpha1 "github.com/pxn-project/pxn/api/v1alpha1"
	"github.com/pxn-project/pxn/internal/cli"
	"github.com/pxn-project/pxn/internal/version"
	"github.com/pxn-project/pxn/pkg/agent"
)

func newVerifyNodeCommand(ctx context.Context) *cobra.Command {
	var kubeconfig, node, bench, size string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "verify-node",
		Short: "Judge one node: its rails, and a cross-rail write relayed there",
		Long: `Checks that the node's PxnRailMap is Ready and Consistent and that a cross-rail
write, run with pxn-bench's two host-path ranks in this pod's registry folder,
is carried by a relay and arrives verified. Prints one line, PASS or FAIL with
the reasons, and exits non-zero on FAIL. The chart's helm test runs it in a
pod on each selected node.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if node == "" {
				return errors.New("--node-name is empty and " + cli.NodeNameEnv + " is not set")
			}
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return cli.Failed(fmt.Errorf("no Kubernetes client configuration: %w", err))
			}
			cfg.UserAgent = "pxn-agent/" + version.String()
			scheme := runtime.NewScheme()
			if err := pxnv1alpha1.AddToScheme(scheme); err != nil {
				return cli.Failed(err)
			}
			c, err := client.New(cfg, client.Options{Scheme: scheme})
			if err != nil {
				return cli.Failed(err)
			}
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			v := agent.VerifyNode(ctx, node, railMaps{c}, agent.BenchRelay{Bench: bench, Bytes: size, Dir: os.TempDir()})
			fmt.Fprintln(cmd.OutOrStdout(), v.Line)
			if !v.Pass {
				return cli.ExitError{Code: 1}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster or $KUBECONFIG")
	cli.BindNodeName(cmd.Flags(), &node)
	cmd.Flags().StringVar(&bench, "bench", "/usr/local/bin/pxn-bench", "the pxn-bench binary")
	cmd.Flags().StringVar(&size, "bytes", "16MiB", "bytes each rank writes across rails")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "bound on the whole check")
	return cmd
}

type railMaps struct{ c client.Client }

func (r railMaps) GetRailMap(ctx context.Context, node string) (*pxnv1alpha1.PxnRailMap, error) {
	m := &pxnv1alpha1.PxnRailMap{}
	if err := r.c.Get(ctx, types.NamespacedName{Name: node}, m); err != nil {
		return nil, err
	}
	return m, nil
}

// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// ServerConfig places the plugin's socket and finds the kubelet's.
type ServerConfig struct {
	// ResourceName is registered with the kubelet.
	ResourceName string
	// PluginDir holds kubelet.sock and the plugin's socket.
	PluginDir string
	// SocketName is the plugin socket's file name in PluginDir; empty
	// derives one from ResourceName.
	SocketName string
	// CheckInterval is how often both sockets are checked besides the
	// directory watch; zero means one second.
	CheckInterval time.Duration
	// Logger receives the server's lines (serving, registering, the
	// kubelet's calls that failed); the zero Logger discards them.
	Logger klog.Logger
}

// SocketNameFor derives a plugin socket name from a resource name.
func SocketNameFor(resourceName string) string {
	return strings.NewReplacer("/", "-", ".", "-").Replace(resourceName) + ".sock"
}

// Server serves a Resource on a unix socket in the kubelet's device-plugin
// directory and keeps it registered: serve, confirm by dialing, register; again
// whenever kubelet.sock is re-created or the plugin's socket disappears.
type Server struct {
	cfg           ServerConfig
	resource      Resource
	metrics       *Metrics
	socket        string
	kubeletSocket string

	// registered is written by Run's goroutine only, read by it and by
	// probes.
	registered atomic.Bool

	// Set while serving; owned by Run's goroutine.
	grpc   *grpc.Server
	stop   chan struct{}
	served chan struct{}
	own    fileID
}

// NewServer returns a Server for resource.
func NewServer(cfg ServerConfig, resource Resource, m *Metrics) *Server {
	if cfg.SocketName == "" {
		cfg.SocketName = SocketNameFor(cfg.ResourceName)
	}
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = time.Second
	}
	cfg.PluginDir = filepath.Clean(cfg.PluginDir)
	return &Server{
		cfg:           cfg,
		resource:      resource,
		metrics:       m,
		socket:        filepath.Join(cfg.PluginDir, cfg.SocketName),
		kubeletSocket: filepath.Join(cfg.PluginDir, "kubelet.sock"),
	}
}

// SocketPath is the plugin socket's path.
func (s *Server) SocketPath() string { return s.socket }

// Registered reports whether the kubelet holds the plugin's current
// registration.
func (s *Server) Registered() bool { return s.registered.Load() }

// fileID tells a re-created file from the old one: a new socket often gets
// the freed inode number back, but not the same change time.
type fileID struct {
	dev, ino uint64
	ctime    syscall.Timespec
}

func statID(path string) (fileID, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: st.Dev, ino: st.Ino, ctime: st.Ctim}, nil
}

// Run serves and registers until ctx ends, then stops serving and removes
// the plugin's own socket (and nothing else).
func (s *Server) Run(ctx context.Context) error {
	if err := os.MkdirAll(s.cfg.PluginDir, 0o755); err != nil {
		return fmt.Errorf("create device plugin directory: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", s.cfg.PluginDir, err)
	}
	defer w.Close()
	if err := w.Add(s.cfg.PluginDir); err != nil {
		return fmt.Errorf("watch %s: %w", s.cfg.PluginDir, err)
	}
	tick := time.NewTicker(s.cfg.CheckInterval)
	defer tick.Stop()

	var (
		kubeletID fileID
		failures  int
	)
	for {
		if s.grpc == nil {
			if err := s.serve(ctx); err != nil {
				s.cfg.Logger.Error(err, "Cannot serve device plugin", "socket", s.socket)
			}
		}
		if s.grpc != nil && !s.registered.Load() {
			kubeletID, _ = statID(s.kubeletSocket)
			if err := s.register(ctx); err != nil {
				if failures++; failures == 1 || failures%60 == 0 {
					s.cfg.Logger.Error(err, "Cannot register with kubelet; retrying", "kubeletSocket", s.kubeletSocket, "attempts", failures)
				}
			} else {
				failures = 0
				s.registered.Store(true)
			}
		}

		restart := false
		select {
		case <-ctx.Done():
			s.registered.Store(false)
			s.teardown()
			s.cfg.Logger.Info("Device plugin stopped", "socket", s.socket)
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("device plugin directory watch closed")
			}
			restart = s.changed(filepath.Clean(ev.Name), kubeletID, s.registered.Load())
		case err := <-w.Errors:
			s.cfg.Logger.Error(err, "Watching device plugin directory", "dir", s.cfg.PluginDir)
		case <-tick.C:
			registered := s.registered.Load()
			restart = s.changed(s.socket, kubeletID, registered) || s.changed(s.kubeletSocket, kubeletID, registered)
		}
		if restart {
			s.teardown()
			s.registered.Store(false)
		}
	}
}

// changed reports whether path, the plugin's socket or kubelet.sock, is no
// longer the file the plugin served or registered with.
func (s *Server) changed(path string, kubeletID fileID, registered bool) bool {
	id, err := statID(path)
	switch path {
	case s.socket:
		if s.grpc != nil && (err != nil || id != s.own) {
			s.cfg.Logger.Info("Plugin socket removed or replaced; serving again", "socket", s.socket)
			return true
		}
	case s.kubeletSocket:
		if registered && err == nil && id != kubeletID {
			s.cfg.Logger.Info("kubelet.sock re-created; registering again", "kubeletSocket", s.kubeletSocket)
			return true
		}
	}
	return false
}

func (s *Server) serve(ctx context.Context) error {
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: s.socket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.socket, err)
	}
	// teardown removes the socket itself, and only when it is still ours.
	l.SetUnlinkOnClose(false)
	id, err := statID(s.socket)
	if err != nil {
		l.Close()
		return fmt.Errorf("stat own socket: %w", err)
	}
	stop := make(chan struct{})
	g := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(g, &service{resource: s.resource, metrics: s.metrics, stop: stop, log: s.cfg.Logger})
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := g.Serve(l); err != nil {
			s.cfg.Logger.Error(err, "Device plugin server ended", "socket", s.socket)
		}
	}()
	s.grpc, s.stop, s.served, s.own = g, stop, served, id

	if err := s.confirm(ctx); err != nil {
		s.teardown()
		return err
	}
	s.cfg.Logger.Info("Serving device plugin", "socket", s.socket, "resource", s.cfg.ResourceName)
	return nil
}

// confirm dials the plugin's own socket and calls it, so the kubelet is only
// told about a socket that answers.
func (s *Server) confirm(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+s.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial own socket %s: %w", s.socket, err)
	}
	defer conn.Close()
	if _, err := pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true)); err != nil {
		return fmt.Errorf("call own socket %s: %w", s.socket, err)
	}
	return nil
}

func (s *Server) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+s.kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial %s: %w", s.kubeletSocket, err)
	}
	defer conn.Close()
	req := &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     s.cfg.SocketName,
		ResourceName: s.cfg.ResourceName,
		Options:      pluginOptions(s.resource),
	}
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, req)
	s.metrics.registered(err)
	if err != nil {
		return fmt.Errorf("register %s at %s: %w", s.cfg.ResourceName, s.kubeletSocket, err)
	}
	s.cfg.Logger.Info("Registered with kubelet", "resource", s.cfg.ResourceName, "endpoint", s.cfg.SocketName,
		"preStartRequired", req.Options.PreStartRequired)
	return nil
}

// teardown stops serving and removes the socket if it is still the one this
// server created.
func (s *Server) teardown() {
	if s.grpc == nil {
		return
	}
	close(s.stop)
	s.grpc.Stop()
	<-s.served
	if id, err := statID(s.socket); err == nil && id == s.own {
		if err := os.Remove(s.socket); err != nil {
			s.cfg.Logger.Error(err, "Cannot remove own socket", "socket", s.socket)
		}
	}
	s.grpc, s.stop, s.served = nil, nil, nil
}

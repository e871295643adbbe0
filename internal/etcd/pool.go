// Package etcd is the only code in QCP that talks to etcd. It keeps one TLS
// client per cluster, and offers the membership, leadership, status, alarm
// and health operations the quorum engine acts through, with errors
// classified as retryable or final.
package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/qcp-dev/qcp/internal/certs"
)

// Config says how to reach one etcd cluster.
type Config struct {
	// Endpoints are client URLs (https://ip:2379). The client keeps them
	// current from the member list, so any one live member is enough.
	Endpoints []string
	// CAPEM is the cluster's etcd CA; CertPEM and KeyPEM the client's pair.
	CAPEM, CertPEM, KeyPEM []byte
	// ClientCertificate, when set, replaces CertPEM and KeyPEM: it is asked
	// for the client certificate at every TLS handshake, so that a
	// certificate it renews reaches every new connection
	// (certs.Renewing.ClientCertificate).
	ClientCertificate func(*tls.CertificateRequestInfo) (*tls.Certificate, error)
	// DialTimeout bounds connecting to an endpoint; 5 s if zero.
	DialTimeout time.Duration
	// AutoSyncInterval refreshes the endpoints from the member list; 0
	// disables it, and callers then call Sync after membership changes.
	AutoSyncInterval time.Duration
	// DialOptions are added to every connection's own, for tests that
	// inject faults with a gRPC interceptor.
	DialOptions []grpc.DialOption
}

// TLSConfig builds the client TLS configuration from the PEM material.
func (c Config) TLSConfig() (*tls.Config, error) {
	pool, err := certs.CertPool(c.CAPEM)
	if err != nil {
		return nil, fmt.Errorf("etcd CA: %w", err)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, GetClientCertificate: c.ClientCertificate}
	if c.ClientCertificate != nil {
		return cfg, nil
	}
	pair, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
	if err != nil {
		return nil, fmt.Errorf("etcd client certificate: %w", err)
	}
	cfg.Certificates = []tls.Certificate{pair}
	return cfg, nil
}

// Pool holds one Client per cluster, so that controllers reuse connections
// instead of dialling (and handshaking) on every reconcile.
type Pool struct {
	mu      sync.Mutex
	clients map[string]*Client
	// versions name the material each client was built from (GetFunc).
	versions map[string]string
}

// NewPool returns an empty pool.
func NewPool() *Pool { return &Pool{clients: map[string]*Client{}, versions: map[string]string{}} }

// Get returns the client for cluster, creating it from cfg on first use.
// A later cfg for the same cluster is ignored until Forget is called; callers
// that rotate certificates call Forget first.
func (p *Pool) Get(cluster string, cfg Config) (*Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.clients[cluster]; ok {
		return c, nil
	}
	c, err := New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client for cluster %s: %w", cluster, err)
	}
	p.clients[cluster] = c
	return c, nil
}

// GetFunc is Get for callers whose Config is costly to build (it issues a
// client certificate): cfg is called only when cluster has no client yet,
// or has one built from material other than version names (an etcd CA
// rotation's stage changes what the client trusts and presents); that one
// is closed and replaced.
func (p *Pool) GetFunc(cluster, version string, cfg func() (Config, error)) (*Client, error) {
	p.mu.Lock()
	c, ok := p.clients[cluster]
	stale := ok && p.versions[cluster] != version
	p.mu.Unlock()
	if ok && !stale {
		return c, nil
	}
	if stale {
		if err := p.Forget(cluster); err != nil {
			return nil, fmt.Errorf("closing the etcd client of cluster %s built from other material: %w", cluster, err)
		}
	}
	built, err := cfg()
	if err != nil {
		return nil, fmt.Errorf("etcd client for cluster %s: %w", cluster, err)
	}
	c, err = p.Get(cluster, built)
	if err == nil {
		p.mu.Lock()
		p.versions[cluster] = version
		p.mu.Unlock()
	}
	return c, err
}

// Forget closes and drops the client for cluster.
func (p *Pool) Forget(cluster string) error {
	p.mu.Lock()
	c, ok := p.clients[cluster]
	delete(p.clients, cluster)
	delete(p.versions, cluster)
	p.mu.Unlock()
	if !ok {
		return nil
	}
	return c.Close()
}

// Close closes every client in the pool.
func (p *Pool) Close() error {
	p.mu.Lock()
	clients := p.clients
	p.clients = map[string]*Client{}
	p.mu.Unlock()
	var errs []error
	for _, c := range clients {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// Client talks to one etcd cluster. Requests that must reach one particular
// member (status, health, leader transfer) go through clients pinned to that
// member's endpoint, kept here so repeated probes reuse their connection.
type Client struct {
	cfg Config
	tls *tls.Config
	cli *clientv3.Client

	mu     sync.Mutex
	pinned map[string]*clientv3.Client
}

// New dials a cluster. gRPC connects lazily, so New succeeds even when no
// member is up yet; the first request reports the failure.
func New(cfg Config) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("no etcd endpoints given")
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	tlsCfg, err := cfg.TLSConfig()
	if err != nil {
		return nil, err
	}
	cli, err := dial(cfg, tlsCfg, cfg.Endpoints, cfg.AutoSyncInterval)
	if err != nil {
		return nil, err
	}
	return &Client{cfg: cfg, tls: tlsCfg, cli: cli, pinned: map[string]*clientv3.Client{}}, nil
}

func dial(cfg Config, tlsCfg *tls.Config, endpoints []string, autoSync time.Duration) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:        endpoints,
		TLS:              tlsCfg.Clone(),
		DialTimeout:      cfg.DialTimeout,
		AutoSyncInterval: autoSync,
		// Keepalive pings find a member that froze with its connection
		// open, so requests stop going there within seconds. etcd's server
		// refuses pings more often than every 5 s by default
		// (--grpc-keepalive-min-time); 10 s stays well clear of that.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		// The client's own logger would interleave gRPC reconnect noise
		// with test and controller logs; errors reach callers anyway.
		Logger: zap.NewNop(),
		// gRPC backs off up to 2 minutes between attempts to reach an
		// endpoint that refused it. A member that is starting (the first
		// one of a new cluster, one restarting) would then stay unseen long
		// after it serves; a short cap keeps the quorum engine's view fresh.
		DialOptions: append([]grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		})}, cfg.DialOptions...),
	})
	if err != nil {
		return nil, fmt.Errorf("dialling etcd %v: %w", endpoints, err)
	}
	return cli, nil
}

// TLSConfig is a copy of the client's TLS configuration (the etcd CA and
// the client certificate), for the agents of the cluster's machines, which
// take the same certificate as etcd's client port.
func (c *Client) TLSConfig() *tls.Config { return c.tls.Clone() }

// Raw returns the underlying clientv3 client for key-value traffic.
func (c *Client) Raw() *clientv3.Client { return c.cli }

// Endpoints returns the endpoints the client currently balances across.
func (c *Client) Endpoints() []string { return c.cli.Endpoints() }

// Sync refreshes the endpoints from the member list (voters with a name only).
func (c *Client) Sync(ctx context.Context) error {
	if err := c.cli.Sync(ctx); err != nil {
		return fmt.Errorf("syncing etcd endpoints: %w", err)
	}
	return nil
}

// SetEndpoints replaces the endpoints, for callers that know the member set
// better than a possibly unreachable cluster does.
func (c *Client) SetEndpoints(endpoints ...string) { c.cli.SetEndpoints(endpoints...) }

// pin returns a client that talks to endpoint only.
func (c *Client) pin(endpoint string) (*clientv3.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.pinned[endpoint]; ok {
		return p, nil
	}
	p, err := dial(c.cfg, c.tls, []string{endpoint}, 0)
	if err != nil {
		return nil, err
	}
	c.pinned[endpoint] = p
	return p, nil
}

// pinnedMaintenance is the maintenance API (status, defragmentation) of
// endpoint's member over its pinned client's connection. The client's own
// Maintenance dials a new connection for every Status or Defragment, a TLS
// handshake on both sides each time: the monitors and every round's
// observation ask each member for its status, and those handshakes were a
// fifth of a scenario's test binary's CPU (docs/measurements.md, stop 63).
// The pinned connection reconnects within a second of a member's return
// (dial's backoff), and its keepalive finds a frozen member.
func (c *Client) pinnedMaintenance(endpoint string) (clientv3.Maintenance, error) {
	p, err := c.pin(endpoint)
	if err != nil {
		return nil, err
	}
	return clientv3.NewMaintenanceFromMaintenanceClient(clientv3.RetryMaintenanceClient(p, p.ActiveConnection()), p), nil
}

// Forget drops the pinned client of an endpoint whose member is gone, so
// that its connection does not retry forever.
func (c *Client) forgetPinned(endpoint string) {
	c.mu.Lock()
	p, ok := c.pinned[endpoint]
	delete(c.pinned, endpoint)
	c.mu.Unlock()
	if ok {
		_ = p.Close()
	}
}

// Close closes the cluster client and every pinned client.
func (c *Client) Close() error {
	c.mu.Lock()
	pinned := c.pinned
	c.pinned = map[string]*clientv3.Client{}
	c.mu.Unlock()
	errs := []error{c.cli.Close()}
	for _, p := range pinned {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

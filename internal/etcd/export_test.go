package etcd

import clientv3 "go.etcd.io/etcd/client/v3"

// OnVoter exposes onVoter to the external tests.
func (c *Client) OnVoter(fn func(*clientv3.Client) error) error { return c.onVoter(fn) }

// Balanced is the client's load-balanced client, the one onVoter tries
// first.
func (c *Client) Balanced() *clientv3.Client { return c.cli }

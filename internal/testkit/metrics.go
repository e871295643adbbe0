package testkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Metric returns the value of the first sample on the Prometheus endpoint
// at addr (host:port) whose name and labels start with series, e.g.
// `qcp_process_lb_backends{cluster="c1"`. Labels appear sorted by name.
func Metric(ctx context.Context, addr, series string) (float64, error) {
	return metricAt(ctx, http.DefaultClient, "http://"+addr, series)
}

// metricAt is Metric for the endpoint at base (scheme://host:port), asked
// with hc: an etcd member's, over TLS with the client's certificate.
func metricAt(ctx context.Context, hc *http.Client, base, series string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, series) {
			fields := strings.Fields(line)
			return strconv.ParseFloat(fields[len(fields)-1], 64)
		}
	}
	return 0, fmt.Errorf("%w %s on the metrics endpoint", ErrNoSample, series)
}

// ErrNoSample is Metric's error when the endpoint has no such sample.
var ErrNoSample = errors.New("no sample")

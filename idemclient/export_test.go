package idemclient

import (
	"context"
	"time"
)

// SetSleep makes a Transport built from o wait with sleep instead of a
// timer, so that tests of backoff take no time.
func SetSleep(o *Options, sleep func(ctx context.Context, d time.Duration) error) { o.sleep = sleep }

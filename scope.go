package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// Limits on the parts of a Scope, checked before anything is written.
const (
	MaxTenantBytes   = 255
	MaxEndpointBytes = 1024
	MaxKeyBytes      = 255
)

// Scope names one idempotency key: the key is unique within a tenant and an
// endpoint, never globally, so two tenants that pick the same key never meet.
type Scope struct {
	// Tenant is the authenticated caller. It may be empty for a service
	// with a single tenant. At most MaxTenantBytes.
	Tenant string
	// Endpoint names the operation, e.g. "POST /v1/payments". At most
	// MaxEndpointBytes.
	Endpoint string
	// Key is the client's idempotency key: 1 to MaxKeyBytes bytes.
	Key string
}

// Validate reports whether s can be stored; the error matches
// ErrInvalidScope.
func (s Scope) Validate() error {
	switch {
	case s.Key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidScope)
	case len(s.Key) > MaxKeyBytes:
		return fmt.Errorf("%w: key is %d bytes, more than %d", ErrInvalidScope, len(s.Key), MaxKeyBytes)
	case len(s.Tenant) > MaxTenantBytes:
		return fmt.Errorf("%w: tenant is %d bytes, more than %d", ErrInvalidScope, len(s.Tenant), MaxTenantBytes)
	case len(s.Endpoint) > MaxEndpointBytes:
		return fmt.Errorf("%w: endpoint is %d bytes, more than %d", ErrInvalidScope, len(s.Endpoint), MaxEndpointBytes)
	}
	return nil
}

// KeyHash returns a short, stable digest of an idempotency key, for logs
// and listings that must not show the key itself.
func KeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

// DownstreamKey derives the idempotency key to send to a downstream service
// (a payment provider, say) for one step of the operation named by s. It is
// deterministic, so a reconciler or a retry that repeats the step sends the
// same key and the provider deduplicates it; distinct scopes and steps get
// distinct keys.
func DownstreamKey(s Scope, step string) string {
	h := sha256.New()
	for _, part := range []string{"idem-downstream-v1", s.Tenant, s.Endpoint, s.Key, step} {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(part))))
		h.Write([]byte(part))
	}
	return hex.EncodeToString(h.Sum(nil))
}

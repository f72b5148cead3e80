package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/idemkv/idem"
)

// tenantSecretEnv holds the tenant secret when no --tenant-secret-file
// is given.
const tenantSecretEnv = "IDEM_TENANT_SECRET"

// minTenantSecret is the shortest tenant secret accepted: 32 bytes of
// idem keygen --format token are more.
const minTenantSecret = 32

// signatureSkew is how far a gateway's signing time may be from the
// proxy's clock: a signed header replayed later than this is refused.
const signatureSkew = 5 * time.Minute

// signatureSuffix names the header that signs a tenant header: with
// --tenant-from header:X-Account, X-Account-Signature.
const signatureSuffix = "-Signature"

// tenancy derives a request's tenant as --tenant-from says, under the
// deployment's secret when there is one.
type tenancy struct {
	from   string // auth, none or header:NAME
	header string // NAME, for header:NAME
	secret []byte // nil: none configured
	now    func() time.Time
}

func parseTenantFrom(s string) (*tenancy, error) {
	t := &tenancy{from: s, now: time.Now}
	switch {
	case s == "auth", s == "none":
		return t, nil
	case strings.HasPrefix(s, "header:"):
		t.header = strings.TrimPrefix(s, "header:")
		if t.header == "" || strings.ContainsAny(t.header, " \t:\r\n") {
			return nil, fmt.Errorf("--tenant-from %q: the header name is missing or malformed", s)
		}
		return t, nil
	}
	return nil, fmt.Errorf("--tenant-from %q: want auth, header:NAME or none", s)
}

// loadSecret reads the tenant secret from file, else from the
// environment; none is no error.
func (t *tenancy) loadSecret(file string) error {
	v := os.Getenv(tenantSecretEnv)
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("--tenant-secret-file: %w", err)
		}
		v = string(b)
	}
	v = strings.TrimSpace(v)
	if v != "" && len(v) < minTenantSecret {
		return fmt.Errorf("the tenant secret is %d characters; it needs at least %d (idem keygen --format token makes one)", len(v), minTenantSecret)
	}
	if v != "" {
		t.secret = []byte(v)
	}
	return nil
}

// warning says what the configuration trusts that a deployment should
// know, "" when nothing.
func (t *tenancy) warning() string {
	switch {
	case t.from == "none":
		return "--tenant-from none: all callers share one key space and each other's stored responses; " +
			"a caller who sends another's key gets that caller's answer. Use it only behind a single trusted client"
	case t.header != "" && t.secret == nil:
		return "--tenant-from " + t.from + " without a tenant secret trusts a header any client can set: whoever sends another " +
			"account's header and key gets that account's stored answer. Set --tenant-secret-file so that the gateway signs it (" +
			t.header + signatureSuffix + ")"
	case t.header == "" && t.secret == nil:
		return "--tenant-from auth without a tenant secret stores a plain SHA-256 of each Authorization header, which can be " +
			"guessed offline for weak credentials; set --tenant-secret-file to key it"
	}
	return ""
}

// tenant is the idemhttp.Options.Tenant of the proxy.
func (t *tenancy) tenant(r *http.Request) (string, error) {
	switch {
	case t.from == "none":
		return "", nil
	case t.header == "":
		// Hashed: the tenant is stored in every record key, and a
		// credential has no business on disk.
		v, err := oneHeader(r, "Authorization")
		if err != nil {
			return "", err
		}
		return t.digest(v), nil
	}
	// Taken as is: a header set by an authenticating gateway names an
	// account, which is worth reading in the store.
	v, err := oneHeader(r, t.header)
	if err != nil {
		return "", err
	}
	if len(v) > idem.MaxTenantBytes {
		return "", fmt.Errorf("the %s header is longer than %d bytes", t.header, idem.MaxTenantBytes)
	}
	if t.secret != nil {
		if err := t.verify(v, r.Header.Get(t.header+signatureSuffix)); err != nil {
			return "", err
		}
	}
	return v, nil
}

// digest is the tenant of a credential: its HMAC-SHA256 under the secret,
// or without one its SHA-256.
func (t *tenancy) digest(credential string) string {
	if t.secret == nil {
		sum := sha256.Sum256([]byte(credential))
		return hex.EncodeToString(sum[:])
	}
	mac := hmac.New(sha256.New, t.secret)
	mac.Write([]byte(credential))
	return hex.EncodeToString(mac.Sum(nil))
}

// sign is the signature header a gateway sends with tenant value at
// time at: "t=UNIX,v=HEX", HEX the HMAC-SHA256 of "UNIX.value".
func sign(secret []byte, value string, at time.Time) string {
	ts := strconv.FormatInt(at.Unix(), 10)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts + "." + value))
	return "t=" + ts + ",v=" + hex.EncodeToString(mac.Sum(nil))
}

var errBadSignature = errors.New("the tenant header's signature is missing, malformed, stale or wrong")

// verify checks that sig signs value within signatureSkew of now.
func (t *tenancy) verify(value, sig string) error {
	ts, mac, ok := strings.Cut(sig, ",")
	ts, ok1 := strings.CutPrefix(ts, "t=")
	_, ok2 := strings.CutPrefix(mac, "v=")
	if !ok || !ok1 || !ok2 {
		return errBadSignature
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errBadSignature
	}
	at := time.Unix(unix, 0)
	if d := t.now().Sub(at); d > signatureSkew || d < -signatureSkew {
		return errBadSignature
	}
	if !hmac.Equal([]byte(sign(t.secret, value, at)), []byte(sig)) {
		return errBadSignature
	}
	return nil
}

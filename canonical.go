package idem

import "github.com/idemkv/idem/contract"

// Canonical requests and their fingerprints, defined and documented in
// package contract (which a fuzzer or a client can import without the
// embedded store) and named here for programs that use the store.
type (
	Request          = contract.Request          // see contract.Request
	CanonicalOptions = contract.CanonicalOptions // see contract.CanonicalOptions
	Profile          = contract.Profile          // see contract.Profile
	BodyError        = contract.BodyError        // see contract.BodyError
)

// The canonicalization profiles; see contract.Profile.
const (
	ProfileExact = contract.ProfileExact
	ProfileJCS   = contract.ProfileJCS
)

// ErrInvalidBody is contract.ErrInvalidBody: a body the canonicalizer
// refuses.
var ErrInvalidBody = contract.ErrInvalidBody

// ParseProfile is contract.ParseProfile.
func ParseProfile(s string) (Profile, error) { return contract.ParseProfile(s) }

// Canonicalize is contract.Canonicalize.
func Canonicalize(src []byte, o CanonicalOptions) ([]byte, error) {
	return contract.Canonicalize(src, o)
}

package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"

	"github.com/idemkv/idem"
)

// body builds a deterministic order-like JSON document of about size
// bytes: members out of order, prices with fractions, a few escapes and
// non-ASCII names, the mix an API write carries. Numbers stay within 15
// significant digits so that every implementation prints the same bytes.
func body(size int) []byte {
	r := rand.New(rand.NewPCG(1, uint64(size)))
	var b strings.Builder
	b.WriteString(`{"order_id":"ord_8f14e45fceea167a","currency":"EUR","customer":{"name":"Jérôme \"JJ\" Müller","email":"j@example.com","tier":3},"items":[`)
	for i := 0; b.Len() < size-120; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sku":"SKU-%05d","qty":%d,"unit_price":%d.%02d,"tags":["a\u00e9","b\n"],"discount":%g,"meta":{"z":null,"y":true,"x":%d}}`,
			r.IntN(100000), 1+r.IntN(9), r.IntN(1000), r.IntN(100), float64(r.IntN(50))/100, r.Int64N(1<<40))
	}
	b.WriteString(`],"total":12345.67,"notes":"leave at the door \u2013 thanks"}`)
	return []byte(b.String())
}

func BenchmarkCanonical(b *testing.B) {
	for _, size := range []struct {
		name string
		n    int
	}{{"1KiB", 1 << 10}, {"64KiB", 64 << 10}} {
		src := body(size.n)
		want, err := jcs.Transform(src)
		if err != nil {
			b.Fatal(err)
		}
		got, err := idem.Canonicalize(src, idem.CanonicalOptions{})
		if err != nil || !bytes.Equal(got, want) {
			b.Fatalf("idem and jcs disagree on the benchmark body (%v)", err)
		}
		req := idem.Request{Method: "POST", Path: "/v1/orders", Tenant: "acme", ContentType: "application/json", Body: src}
		impls := []struct {
			name string
			run  func() error
		}{
			{"idem", func() error {
				_, err := req.Fingerprint(idem.CanonicalOptions{})
				return err
			}},
			{"idem_jcs_profile", func() error {
				_, err := req.Fingerprint(idem.CanonicalOptions{Profile: idem.ProfileJCS})
				return err
			}},
			{"jcs", func() error {
				out, err := jcs.Transform(src)
				sha256.Sum256(out)
				return err
			}},
			{"encoding_json", func() error {
				var v any
				if err := json.Unmarshal(src, &v); err != nil {
					return err
				}
				out, err := json.Marshal(v)
				sha256.Sum256(out)
				return err
			}},
		}
		for _, impl := range impls {
			b.Run("size="+size.name+"/impl="+impl.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(src)))
				for b.Loop() {
					if err := impl.run(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

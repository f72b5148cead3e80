package fuzz

import (
	"errors"
	"testing"

	"github.com/idemkv/idem"
)

// FuzzKeyFile: any key file is either refused with ErrKeyFile or gives a
// ring whose newest key seals values that open again, and only in place.
func FuzzKeyFile(f *testing.F) {
	f.Add([]byte("k1 MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"))
	f.Add([]byte("# old\nk1 MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\nk2 ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=\n"))
	f.Add([]byte("k1 short\n"))
	f.Add([]byte("\xff\x00 \n"))
	f.Fuzz(func(t *testing.T, file []byte) {
		k, err := idem.ParseKeyring(file)
		if err != nil {
			if !errors.Is(err, idem.ErrKeyFile) {
				t.Fatalf("refused without ErrKeyFile: %v", err)
			}
			return
		}
		at := idem.SealContext(idem.Scope{Tenant: "t", Endpoint: "e", Key: "k"}, "body")
		sealed := k.Seal(file, at)
		plain, err := k.Open(sealed, at)
		if err != nil || string(plain) != string(file) {
			t.Fatalf("a sealed value does not open: %v", err)
		}
		if _, err := k.Open(sealed, idem.SealContext(idem.Scope{Tenant: "t", Endpoint: "e", Key: "j"}, "body")); !errors.Is(err, idem.ErrCorrupt) {
			t.Fatalf("a value opened in another record: %v", err)
		}
	})
}

// FuzzOpen: whatever bytes a stolen or damaged disk holds, opening them
// fails with ErrCorrupt or ErrKeyMissing, and never panics.
func FuzzOpen(f *testing.F) {
	k, err := idem.ParseKeyring([]byte("k1 MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"))
	if err != nil {
		f.Fatal(err)
	}
	at := idem.SealContext(idem.Scope{Tenant: "t", Endpoint: "e", Key: "k"}, "body")
	good := k.Seal([]byte("paid"), at)
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add([]byte{1, 2, 'k', '2', 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, sealed []byte) {
		plain, err := k.Open(sealed, at)
		switch {
		case err == nil && string(plain) != "paid":
			t.Fatalf("forged value opened: %q", plain)
		case err != nil && !errors.Is(err, idem.ErrCorrupt) && !errors.Is(err, idem.ErrKeyMissing):
			t.Fatalf("unexpected error: %v", err)
		}
	})
}

package main

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
)

// bodies holds the response bodies the systems store, n bytes each. Real
// responses of one endpoint share a shape but not their identifiers, so
// each operation stores one of many variants, chosen by its key: were all
// the same, a store that compresses blocks of several records would keep
// one copy per block, a saving no real workload offers.
type bodies struct {
	n    int
	seed maphash.Seed
	v    [][]byte
}

func newBodies(n int) bodies {
	b := bodies{n: n, seed: maphash.MakeSeed(), v: make([][]byte, variantCount(n))}
	for i := range b.v {
		b.v[i] = responseBody(n, i)
	}
	return b
}

// variantBudget bounds the memory the variants of a size take together,
// except that there is always one.
const variantBudget = 32 << 20

// variantCount is how many variants of size n a run keeps: enough that two
// records of a table block seldom share one, within variantBudget.
func variantCount(n int) int { return max(1, min(1024, variantBudget/max(n, 1))) }

// of returns the body of the operation on key: the same in every system.
func (b bodies) of(key string) []byte {
	return b.v[maphash.String(b.seed, key)%uint64(len(b.v))]
}

// responseBody returns variant v of the n-byte response body: a JSON
// object shaped like a payment API's answer, whose field names and
// enumerations repeat while its identifiers, amounts and times do not. S2
// shrinks it about 1.5 times at 1 KiB and about twice from 4 KiB, no more
// than it does real responses; a body of zeros, which compresses some
// twentyfold, would flatter any store that compresses, idem and Pebble's
// tables included. The same n and v give the same bytes, in every run;
// below about 250 bytes it is the object's first n bytes, not valid JSON.
func responseBody(n, v int) []byte {
	rng := rand.New(rand.NewPCG(uint64(n), uint64(v)+1))
	id := func(prefix string) string {
		const alnum = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
		b := []byte(prefix)
		for range 24 {
			b = append(b, alnum[rng.IntN(len(alnum))])
		}
		return string(b)
	}
	words := []string{"annual", "plan", "seats", "support", "premium", "storage", "usage", "overage", "credit", "monthly", "team", "api"}
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"object":"payment","id":%q,"amount":%d,"currency":"usd","status":"succeeded","customer":%q,"created":%d,"livemode":false,"lines":[`,
		id("pay_"), 100+rng.IntN(1_000_000), id("cus_"), 1_780_000_000+rng.IntN(10_000_000))
	const end = `],"note":""}`
	for i := 0; ; i++ {
		item := fmt.Sprintf(`{"id":%q,"amount":%d,"quantity":%d,"description":"%s %s"}`,
			id("li_"), 100+rng.IntN(100_000), 1+rng.IntN(20), words[rng.IntN(len(words))], words[rng.IntN(len(words))])
		if i > 0 {
			item = "," + item
		}
		if b.Len()+len(item)+len(end) > n {
			break
		}
		b.WriteString(item)
	}
	// Pad the note to n bytes; a body too small for the object above is
	// its first n bytes.
	note := max(0, n-b.Len()-len(end))
	b.WriteString(end[:len(end)-2])
	b.Write(bytes.Repeat([]byte{'.'}, note))
	b.WriteString(`"}`)
	return b.Bytes()[:n]
}

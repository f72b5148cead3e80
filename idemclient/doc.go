// Package idemclient is the client half of the idempotency-key contract: an
// http.RoundTripper that retries writes without ever turning one operation
// into two.
//
// Make a Transport with NewTransport and put it in an http.Client of your
// own; name an operation on a request's context with WithOperation; read
// what happened with Replayed, Key and Attempts. A KeyStore keeps
// operations' keys across restarts.
//
// # One key per operation
//
// The server can only recognize a retry if it carries the key of the first
// attempt. A Transport therefore gives a request that needs a key (a POST,
// unless Options.Methods says otherwise) one random key before the first
// attempt and sends that same key on every retry; a request that already
// has a key keeps it. Naming the operation with WithOperation and setting
// Options.KeyStore stretches "the same key" across restarts: the key is
// stored before anything is sent, and a restarted client asking for the
// same operation sends it again, so the server replays the outcome of the
// attempt that was cut off instead of running it twice. StoreKeyStore keeps
// keys in an idem DB; MemoryKeyStore keeps them in memory.
//
// # What is retried
//
// Only outcomes that leave the operation open: transport errors and
// timeouts, 408, 425, 429, 500, 502, 503, 504, and 409 with the problem
// code request_in_progress. A 422 means the key belongs to another request
// and retrying would not change that; a 409 outcome_pending waits for the
// server to resolve an earlier attempt; other 4xx are the caller's to fix.
// A 401 calls Options.Refresh, if set, and repeats the attempt once with
// the same key. Waits grow exponentially with full jitter, never undercut
// the server's Retry-After (a server asking for more than
// Options.MaxRetryAfter ends the call instead), and stop at once when the
// request's context ends. Attempts and total time are both capped. The policy is made of
// exported function types (CheckRetry, Backoff, Definitive) with exported
// defaults that callers may wrap.
//
// # What the caller sees
//
// A final response is returned as it came, whatever its status: Replayed
// says whether the server served it from its store, Key which key was sent,
// Attempts how many attempts it took. A call that ends without one returns
// a *RetryError with the key, the attempt count and the last status, which
// unwraps to the last cause.
package idemclient

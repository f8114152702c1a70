package proxy

// maxPooledBytes is the largest buffer a released pooled buffer keeps for
// reuse; the rare huge one goes to the garbage collector instead of
// pinning memory in the pool.
const maxPooledBytes = 64 << 10

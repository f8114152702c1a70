package bench

import (
	"math"
	"slices"
	"sync"
	"time"
)

// collector accumulates outcomes from concurrent requests; the progress bar
// reads it while they run.
type collector struct {
	mu         sync.Mutex
	start      time.Time
	total      int
	inFlight   int
	ok         int
	errs       int
	kinds      map[string]int
	ttfts      []float64
	prompt     int64
	cached     int64
	completion int64
	noUsage    int
	queuedN    int
	queuedSum  time.Duration
	queuedMax  time.Duration
}

func newCollector(total int) *collector {
	return &collector{total: total, kinds: map[string]int{}}
}

func (c *collector) issued() {
	c.mu.Lock()
	c.inFlight++
	c.mu.Unlock()
}

func (c *collector) queued(wait time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queuedN++
	c.queuedSum += wait
	c.queuedMax = max(c.queuedMax, wait)
}

func (c *collector) add(o outcome) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inFlight--
	if o.kind != "" {
		c.errs++
		c.kinds[o.kind]++
		return
	}
	c.ok++
	c.ttfts = append(c.ttfts, float64(o.ttft)/float64(time.Millisecond))
	if !o.hasUsage {
		c.noUsage++
		return
	}
	c.prompt += o.prompt
	c.cached += o.cached
	c.completion += o.completion
}

// snapshot is what the progress bar shows.
type snapshot struct {
	total, done, errs, inFlight int
	elapsed                     time.Duration
}

func (c *collector) snapshot() snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return snapshot{total: c.total, done: c.ok + c.errs, errs: c.errs, inFlight: c.inFlight, elapsed: time.Since(c.start)}
}

func (c *collector) result(name string, wall time.Duration) Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := Result{
		Name:           name,
		Requests:       c.ok,
		Errors:         c.errs,
		ErrorsByKind:   make(map[string]int, len(c.kinds)),
		PromptTokens:   c.prompt,
		CachedTokens:   c.cached,
		NoUsage:        c.noUsage,
		QueuedRequests: c.queuedN,
		WallSeconds:    wall.Seconds(),
		TTFTsMs:        slices.Clone(c.ttfts),
	}
	for k, v := range c.kinds {
		r.ErrorsByKind[k] = v
	}
	if c.prompt > 0 {
		r.HitRatio = float64(c.cached) / float64(c.prompt)
	}
	if c.queuedN > 0 {
		r.MeanQueueWaitMs = float64(c.queuedSum) / float64(c.queuedN) / float64(time.Millisecond)
		r.MaxQueueWaitMs = float64(c.queuedMax) / float64(time.Millisecond)
	}
	if s := wall.Seconds(); s > 0 {
		r.Goodput = float64(c.ok) / s
		r.OutputTokensPerS = float64(c.completion) / s
	}
	sorted := slices.Clone(c.ttfts)
	slices.Sort(sorted)
	r.TTFTP50Ms = percentile(sorted, 0.50)
	r.TTFTP90Ms = percentile(sorted, 0.90)
	r.TTFTP99Ms = percentile(sorted, 0.99)
	if len(sorted) > 0 {
		var sum float64
		for _, v := range sorted {
			sum += v
		}
		r.MeanTTFTMs = sum / float64(len(sorted))
	}
	return r
}

// percentile interpolates linearly between closest ranks of sorted samples;
// 0 for no samples.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	pos := p * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	frac := pos - float64(lo)
	return sorted[lo] + (sorted[hi]-sorted[lo])*frac
}

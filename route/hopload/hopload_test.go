package hopload

import (
	"testing"
	"time"
)

func TestAdd(t *testing.T) {
	ms := func(at Millis, blocks float64, prefilled bool) Sent[Millis] {
		return Sent[Millis]{At: at, Blocks: blocks, Prefilled: prefilled}
	}
	id := func(s Sent[Millis]) Sent[Millis] { return s }
	cases := []struct {
		name  string
		told  Load
		heard Millis
		q     []Sent[Millis]
		want  Load
	}{
		{"nothing sent", Load{InFlight: 2, Pending: 3}, 10, nil, Load{InFlight: 2, Pending: 3}},
		{"all before the report", Load{InFlight: 2}, 10, []Sent[Millis]{ms(1, 4, false), ms(10, 5, false)}, Load{InFlight: 2}},
		{"after the report count", Load{InFlight: 1, Pending: 1}, 10,
			[]Sent[Millis]{ms(5, 4, false), ms(11, 5, false), ms(12, 6, true)}, Load{InFlight: 3, Pending: 6}},
		{"told nothing: all count", Load{}, -1, []Sent[Millis]{ms(0, 4, false), ms(3, 5, true)}, Load{InFlight: 2, Pending: 4}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Add(c.told, c.heard, c.q, id); got != c.want {
				t.Errorf("Add = %+v, want %+v", got, c.want)
			}
		})
	}
}

// TestAddTime: a router's clock counts the same way.
func TestAddTime(t *testing.T) {
	t0 := time.Unix(1000, 0)
	q := []Sent[time.Time]{{At: t0, Blocks: 1}, {At: t0.Add(time.Second), Blocks: 2}, {At: t0.Add(2 * time.Second), Blocks: 4, Prefilled: true}}
	got := Add(Load{}, t0.Add(500*time.Millisecond), q, func(s Sent[time.Time]) Sent[time.Time] { return s })
	if want := (Load{InFlight: 2, Pending: 2}); got != want {
		t.Errorf("Add = %+v, want %+v", got, want)
	}
}

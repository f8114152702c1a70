package status

import (
	"fmt"
	"strings"

	"github.com/kvmesh/kvmesh/mesh"
)

// loraCell is one replica's LoRA adapters: those its engine ran (loaded)
// and queued when it last ran any, against the engine's limit, as this router's health checks
// read them or, for another router's replica, as its owner gossips them.
type loraCell struct {
	Has             bool
	Loaded, Waiting string // comma-separated names, "" for none
	Active, Max     string // Max "?" when unknown
}

func loraCellOf(r mesh.ReplicaDebug) loraCell {
	if r.LoRAMax == 0 && r.LoRAActive == 0 {
		return loraCell{}
	}
	c := loraCell{Has: true, Loaded: strings.Join(r.LoRALoaded, ", "), Waiting: strings.Join(r.LoRAWaiting, ", "),
		Active: fmt.Sprint(r.LoRAActive), Max: "?"}
	if r.LoRAMax > 0 {
		c.Max = fmt.Sprint(r.LoRAMax)
	}
	return c
}

// HasLoRA reports that some replica's engine tells of LoRA adapters: the
// replicas table then has a LoRA column.
func (v *view) HasLoRA() bool {
	for i := range v.Replicas {
		if v.Replicas[i].LoRA.Has {
			return true
		}
	}
	return false
}

package testkit

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// kvInput is one operation on one key: a Put of a unique value or a Get.
type kvInput struct {
	Put   bool
	Key   string
	Value string
}

// kvOutput is what a Get returned ("" for a missing key). Puts have none.
type kvOutput struct {
	Value string
}

// kvModel is a register per key. Partitioning by key lets porcupine check
// each key's history on its own, which keeps long histories cheap.
var kvModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range history {
			k := op.Input.(kvInput).Key
			if _, ok := byKey[k]; !ok {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, k := range order {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		in := input.(kvInput)
		if in.Put {
			return true, in.Value
		}
		return output.(kvOutput).Value == state.(string), state
	},
	DescribeOperation: func(input, output any) string {
		in := input.(kvInput)
		if in.Put {
			return fmt.Sprintf("put(%s, %s)", in.Key, in.Value)
		}
		return fmt.Sprintf("get(%s) -> %q", in.Key, output.(kvOutput).Value)
	},
}

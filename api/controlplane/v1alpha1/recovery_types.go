package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// QuorumLossRecoveryPolicy is what QCP does once etcd has lost quorum for
// good.
// +kubebuilder:validation:Enum=Manual;FromSurvivor;FromBackup
type QuorumLossRecoveryPolicy string

const (
	// RecoveryManual reports the loss and waits for a human, who may
	// trigger one recovery with RecoverAnnotation.
	RecoveryManual QuorumLossRecoveryPolicy = "Manual"
	// RecoveryFromSurvivor rebuilds etcd from the surviving member with
	// the highest applied index, once the loss has lasted afterSeconds and
	// every lost member's machine is confirmed lost.
	RecoveryFromSurvivor QuorumLossRecoveryPolicy = "FromSurvivor"
	// RecoveryFromBackup recovers as FromSurvivor while a member survives
	// (it holds newer data than any snapshot). Once none answers, and
	// every machine that hosted one is confirmed lost, it restores the
	// newest verified snapshot of spec.backup onto a new machine; what
	// was written after that snapshot is lost. Needs spec.backup.
	RecoveryFromBackup QuorumLossRecoveryPolicy = "FromBackup"
)

// DefaultRecoveryAfterSeconds is how long a quorum loss lasts before
// FromSurvivor recovers, when afterSeconds is unset.
const DefaultRecoveryAfterSeconds = 300

// RecoverAnnotation, set on the control plane to "survivor", triggers one
// recovery from a survivor now, whatever the policy and afterSeconds say;
// set to "backup", one recovery as FromBackup does (from a survivor while
// one answers, else from the newest verified snapshot). Fencing still
// applies. QCP removes it once the recovery is done.
const RecoverAnnotation = "controlplane.cluster.x-k8s.io/qcp-recover"

// RecoverAnnotation's values.
const (
	RecoverFromSurvivorValue = "survivor"
	RecoverFromBackupValue   = "backup"
)

// QuorumLossRecovery says what QCP does when a majority of etcd members is
// lost for good. Whatever the policy, QCP recovers only once every member
// that does not answer runs on a machine confirmed lost: its
// infrastructure reports it stopped or gone, or the Machine carries the
// annotation controlplane.cluster.x-k8s.io/qcp-confirmed-lost. A member
// that may still run behind a partition would otherwise serve beside the
// recovered cluster.
type QuorumLossRecovery struct {
	// policy is Manual (the default: report the loss and wait for a
	// human), FromSurvivor: rebuild etcd from the surviving member with
	// the highest applied index, as a new cluster of one that keeps its
	// data with the revision bumped, then grow back with learners; or
	// FromBackup: the same while a member survives, else restore the
	// newest verified snapshot (spec.backup) onto a new machine.
	// +optional
	Policy QuorumLossRecoveryPolicy `json:"policy,omitempty"`
	// afterSeconds is how long the loss must last before FromSurvivor or
	// FromBackup recovers. Defaults to 300.
	// +optional
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=604800
	AfterSeconds *int32 `json:"afterSeconds,omitempty"`
}

// RecoveryStatus reports the last recovery from a quorum loss.
type RecoveryStatus struct {
	// machine is the machine whose member survived and was kept; for a
	// recovery from a backup, the new machine that restored it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Machine string `json:"machine,omitempty"`
	// fromMember is the surviving member's ID in the lost cluster, in hex.
	// +optional
	// +kubebuilder:validation:MaxLength=16
	FromMember string `json:"fromMember,omitempty"`
	// member is the ID of the recovered cluster's first member, in hex.
	// +optional
	// +kubebuilder:validation:MaxLength=16
	Member string `json:"member,omitempty"`
	// snapshot is the snapshot a recovery from a backup restored; empty
	// for a recovery from a survivor.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Snapshot string `json:"snapshot,omitempty"`
	// lostMachines are the machines a recovery from a backup deleted:
	// those of the lost cluster.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=253
	LostMachines []string `json:"lostMachines,omitempty"`
	// lostMembers are the members, in hex, that did not answer and were
	// dropped.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=16
	LostMembers []string `json:"lostMembers,omitempty"`
	// revision is the revision the recovery kept: everything written up
	// to it survived, and nothing after it.
	// +optional
	Revision int64 `json:"revision,omitempty"`
	// startRevision is the revision the recovered cluster starts from:
	// revision, bumped, so that a client watching from before the loss is
	// told its revision was compacted instead of missing events.
	// +optional
	StartRevision int64 `json:"startRevision,omitempty"`
	// trigger is what asked for it: Policy or Annotation.
	// +optional
	// +kubebuilder:validation:Enum=Policy;Annotation
	Trigger string `json:"trigger,omitempty"`
	// startTime is when it started, finishTime when the recovered member
	// answered; unset while it runs.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	FinishTime *metav1.Time `json:"finishTime,omitempty"`
}

//! Hand-written schemas for the few Kubernetes types we embed.
//!
//! k8s-openapi only implements `JsonSchema` behind its `schemars` feature. Turning that on
//! would rebuild k8s-openapi for every crate of the workspace, for three small schemas; and
//! the conditions list needs list-map markers (`x-kubernetes-list-type: map` keyed by
//! `type`) that the generated schema would not carry anyway. Server-side apply merges the
//! conditions per type only with those markers.

use schemars::{Schema, SchemaGenerator, json_schema};

/// `metav1.Time`: an RFC 3339 timestamp.
pub fn time(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "format": "date-time",
    })
}

/// Same as [`time`], for optional fields.
pub fn optional_time(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "format": "date-time",
        "nullable": true,
    })
}

/// A list of `metav1.Condition`, merged per `type` by server-side apply.
pub fn conditions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Standard conditions (metav1.Condition), one per type.",
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status", "lastTransitionTime", "reason", "message"],
            "properties": {
                "type": {
                    "description": "Type of condition in CamelCase.",
                    "type": "string",
                    "maxLength": 316,
                },
                "status": {
                    "description": "True, False or Unknown.",
                    "type": "string",
                    "enum": ["True", "False", "Unknown"],
                },
                "observedGeneration": {
                    "description": "The metadata.generation the condition was set for.",
                    "type": "integer",
                    "format": "int64",
                    "minimum": 0,
                },
                "lastTransitionTime": {
                    "description": "When the status last changed.",
                    "type": "string",
                    "format": "date-time",
                },
                "reason": {
                    "description": "Programmatic identifier of the last transition, in CamelCase.",
                    "type": "string",
                    "maxLength": 1024,
                    "minLength": 1,
                },
                "message": {
                    "description": "Human-readable details; may be empty.",
                    "type": "string",
                    "maxLength": 32768,
                },
            },
        },
    })
}

/// A string map of at most `max` entries whose values are at most `value_max` characters.
/// (The keys are the API server's to check: it refuses a Proxy with a malformed label or
/// annotation key, and the pool reports that refusal as `InvalidSpec`.)
pub fn bounded_map(max: usize, value_max: usize) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": max,
        "additionalProperties": {
            "type": "string",
            "maxLength": value_max,
        },
    })
}

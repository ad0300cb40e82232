//! Kubernetes' CEL, for evaluating what the cluster generators emit: the `cel` crate (a
//! conformance-tested implementation of the CEL spec) with the libraries Kubernetes adds to
//! its environments and the emitted expressions use: the strings extension (`split`) in
//! admission policies, and DRA's `semver` type (`semver("1.2.3")`, `compareTo`,
//! `isGreaterThan`, `isLessThan`) for version attributes.
//!
//! Values come from JSON (pods, node labels, ResourceSlice devices as the API serves them);
//! a DRA version attribute (`{"version": "550.54.15"}`) becomes a [`Semver`], so comparing
//! it as a string fails here as it does in the API server.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use cel::extractors::This;
use cel::objects::Opaque;
use cel::{Context, Env, ExecutionError, Value};

/// A semantic version, as Kubernetes' DRA CEL library holds one.
#[derive(Clone, PartialEq, Eq)]
pub struct Semver([u64; 3]);

impl fmt::Debug for Semver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "semver({}.{}.{})", self.0[0], self.0[1], self.0[2])
    }
}

impl Opaque for Semver {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Semver"
    }
}

impl Semver {
    /// Strict `MAJOR.MINOR.PATCH` (no leading zeros), as semver.org's grammar and
    /// Kubernetes' `semver()` want it.
    pub fn parse(text: &str) -> Option<Semver> {
        let parts: Vec<&str> = text.split('.').collect();
        if parts.len() != 3 {
            return None;
        }
        let mut out = [0u64; 3];
        for (slot, part) in out.iter_mut().zip(parts) {
            if part.is_empty() || (part.len() > 1 && part.starts_with('0')) {
                return None;
            }
            *slot = part.parse().ok()?;
        }
        Some(Semver(out))
    }
}

fn semver_of(value: &Value) -> Result<Semver, ExecutionError> {
    match value {
        Value::Opaque(opaque) => opaque
            .downcast_ref::<Semver>()
            .cloned()
            .ok_or_else(|| ExecutionError::function_error("compareTo", "not a semver")),
        other => Err(ExecutionError::function_error(
            "compareTo",
            format!("no such overload: compareTo on {other:?}"),
        )),
    }
}

fn compare(this: &Value, other: &Value) -> Result<Ordering, ExecutionError> {
    Ok(semver_of(this)?.0.cmp(&semver_of(other)?.0))
}

/// The environment of Kubernetes' CEL as far as the emitted expressions need it.
pub fn environment() -> Arc<Env> {
    let mut env = Env::stdlib();
    env.add_extension(cel::extensions::strings).unwrap();
    Arc::new(env)
}

/// Evaluate `expression` with `variables` (a JSON object: name -> value) to a bool; an
/// error or a non-bool is an Err with the reason.
pub fn evaluate(expression: &str, variables: &serde_json::Value) -> Result<bool, String> {
    let bound: Vec<(String, Value)> = variables
        .as_object()
        .expect("variables are a JSON object")
        .iter()
        .map(|(name, value)| (name.clone(), to_cel(value)))
        .collect();
    match evaluate_value(expression, &bound)? {
        Value::Bool(b) => Ok(b),
        other => Err(format!("`{expression}` evaluates to {other:?}, not a bool")),
    }
}

/// Evaluate `expression` with `variables` bound to CEL values.
pub fn evaluate_value(expression: &str, variables: &[(String, Value)]) -> Result<Value, String> {
    let env = environment();
    let program = env
        .compile(expression)
        .map_err(|e| format!("`{expression}` does not compile: {e}"))?;
    let mut context = Context::with_env(env);
    add_semver_library(&mut context);
    for (name, value) in variables {
        context.add_variable_from_value(name.as_str(), value.clone());
    }
    program
        .execute(&context)
        .map_err(|error| format!("`{expression}` fails: {error}"))
}

fn add_semver_library(context: &mut Context<'_, '_>) {
    context
        .add_function(
            "semver",
            |text: Arc<String>| -> Result<Value, ExecutionError> {
                Semver::parse(&text)
                    .map(|v| Value::Opaque(Arc::new(v)))
                    .ok_or_else(|| {
                        ExecutionError::function_error(
                            "semver",
                            format!("`{text}` is not a semantic version"),
                        )
                    })
            },
        )
        .unwrap();
    context
        .add_function("compareTo", |This(this): This<Value>, other: Value| {
            compare(&this, &other).map(|o| o as i64)
        })
        .unwrap();
    context
        .add_function("isGreaterThan", |This(this): This<Value>, other: Value| {
            compare(&this, &other).map(|o| o == Ordering::Greater)
        })
        .unwrap();
    context
        .add_function("isLessThan", |This(this): This<Value>, other: Value| {
            compare(&this, &other).map(|o| o == Ordering::Less)
        })
        .unwrap();
}

/// The outcome of a ValidatingAdmissionPolicy for one object: not matched (its match
/// conditions are false), admitted, or refused with the first failing validation's message.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    NotMatched,
    Admitted,
    Refused(String),
}

/// Run `policy` (a ValidatingAdmissionPolicy as JSON) on `object` with `params`, as the API
/// server does: match conditions, then the variables in order, then each validation.
pub fn admit(
    policy: &serde_json::Value,
    object: &serde_json::Value,
    params: &serde_json::Value,
) -> Result<Admission, String> {
    let spec = &policy["spec"];
    let mut bound = vec![
        ("object".to_string(), to_cel(object)),
        ("params".to_string(), to_cel(params)),
    ];
    for condition in spec["matchConditions"].as_array().into_iter().flatten() {
        let expression = condition["expression"].as_str().unwrap();
        if evaluate_value(expression, &bound)? != Value::Bool(true) {
            return Ok(Admission::NotMatched);
        }
    }
    let mut variables = std::collections::HashMap::new();
    for variable in spec["variables"].as_array().into_iter().flatten() {
        bound.retain(|(name, _)| name != "variables");
        bound.push(("variables".to_string(), variables.clone().into()));
        let value = evaluate_value(variable["expression"].as_str().unwrap(), &bound)?;
        variables.insert(variable["name"].as_str().unwrap().to_string(), value);
    }
    bound.retain(|(name, _)| name != "variables");
    bound.push(("variables".to_string(), variables.into()));
    for validation in spec["validations"].as_array().into_iter().flatten() {
        match evaluate_value(validation["expression"].as_str().unwrap(), &bound)? {
            Value::Bool(true) => {}
            Value::Bool(false) => {
                return Ok(Admission::Refused(
                    validation["message"].as_str().unwrap_or("").to_string(),
                ))
            }
            other => return Err(format!("a validation evaluates to {other:?}")),
        }
    }
    Ok(Admission::Admitted)
}

/// JSON to CEL values; `{"version": "x.y.z"}` (a DRA version attribute) to a [`Semver`].
pub fn to_cel(value: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match value {
        J::Null => Value::Null,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => n
            .as_i64()
            .map(Value::Int)
            .unwrap_or_else(|| Value::Float(n.as_f64().unwrap())),
        J::String(s) => Value::String(Arc::new(s.clone())),
        J::Array(items) => Value::List(Arc::new(items.iter().map(to_cel).collect())),
        J::Object(map) => {
            if let (1, Some(J::String(version))) = (map.len(), map.get("version")) {
                if let Some(semver) = Semver::parse(version) {
                    return Value::Opaque(Arc::new(semver));
                }
            }
            let entries: std::collections::HashMap<String, Value> =
                map.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect();
            entries.into()
        }
    }
}

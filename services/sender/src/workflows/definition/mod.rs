//! A workflow as the API gives it, checked at the edge, and compiled: its steps become one
//! flat list a run walks with a step counter (`pc`), a branch a conditional jump.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::audience::audiences::{Condition, Op};
use crate::audience::contacts::{name, Contact, Subscription};
use crate::sending::request::EmailType;

mod openapi;

/// Steps one workflow may hold, branches' included.
const MAX_STEPS: usize = 100;
/// How deep branches may nest.
const MAX_DEPTH: usize = 5;
/// Conditions of one trigger, exit or branch.
const MAX_CONDITIONS: usize = 20;
/// Exit rules of one workflow.
const MAX_EXITS: usize = 20;
/// The longest wait: a year.
pub const MAX_WAIT_SECS: i64 = 366 * 24 * 3600;

/// A workflow as the API gives and shows it.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowBody {
    pub name: String,
    pub trigger: RuleBody,
    #[serde(default)]
    pub exit: Vec<RuleBody>,
    #[serde(default)]
    pub reentry: bool,
    pub steps: Vec<Value>,
}

/// A trigger or exit rule: an event name and conditions that must all hold.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = WorkflowRule)]
pub struct RuleBody {
    pub event_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Value>,
}

/// One condition of a rule or branch.
#[derive(Clone, Debug, PartialEq)]
pub enum Cond {
    /// On the contact, as an audience condition.
    Contact(Condition),
    /// On the triggering event's properties.
    Property { name: String, op: Op, value: Value },
}

/// A checked rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub event_name: String,
    pub conditions: Vec<Cond>,
}

/// One step of the compiled list.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Sends template `template_key` to the contact.
    Send {
        template_key: String,
        email_type: EmailType,
        topic: Option<String>,
    },
    /// Waits this many seconds.
    Wait(i64),
    /// Waits until the time in the triggering event's property.
    WaitUntil(String),
    /// Goes on when all conditions hold, else jumps to `otherwise`.
    Branch {
        conditions: Vec<Cond>,
        otherwise: usize,
    },
    /// Goes on at `to`.
    Jump(usize),
}

/// A checked and compiled workflow.
#[derive(Clone, Debug, PartialEq)]
pub struct Workflow {
    pub name: String,
    pub trigger: Rule,
    pub exits: Vec<Rule>,
    pub reentry: bool,
    pub steps: Vec<Step>,
}

fn op_of(raw: Option<&Value>) -> Result<Op, String> {
    let name = match raw {
        None => "eq",
        Some(Value::String(s)) => s.as_str(),
        Some(other) => return Err(format!("op must be a string, not {other}")),
    };
    match name {
        "eq" => Ok(Op::Eq),
        "neq" => Ok(Op::Neq),
        "in" => Ok(Op::In),
        "exists" => Ok(Op::Exists),
        "gt" => Ok(Op::Gt),
        "lt" => Ok(Op::Lt),
        other => Err(format!(
            "op {other:?} is not one of eq, neq, in, exists, gt, lt"
        )),
    }
}

impl Cond {
    fn parse(raw: &Value) -> Result<Self, String> {
        let Some(obj) = raw.as_object().filter(|o| o.contains_key("property")) else {
            return match Condition::parse(raw, false)? {
                Condition::Saved(_) => Err("a workflow condition cannot name an audience".into()),
                c => Ok(Cond::Contact(c)),
            };
        };
        if let Some(k) = obj
            .keys()
            .find(|k| !["property", "op", "value"].contains(&k.as_str()))
        {
            return Err(format!("unknown field {k:?} in a condition"));
        }
        let prop = obj["property"]
            .as_str()
            .ok_or("property must be a string")?;
        let op = op_of(obj.get("op"))?;
        let value = obj.get("value").cloned().unwrap_or(Value::Null);
        if op != Op::Exists && value.is_null() {
            return Err(format!("property {prop:?}: op needs a value"));
        }
        if op == Op::In && value.as_array().is_none_or(|a| a.is_empty()) {
            return Err(format!(
                "property {prop:?}: op in needs a non-empty array value"
            ));
        }
        Ok(Cond::Property {
            name: name("property", prop)?,
            op,
            value,
        })
    }

    /// Whether the condition holds for `contact` and the event's `properties`.
    pub fn holds(&self, contact: &Contact, properties: &Map<String, Value>) -> bool {
        match self {
            Cond::Property { name, op, value } => compare(properties.get(name), *op, value),
            Cond::Contact(Condition::Tag(tag)) => contact.tags.contains(tag),
            Cond::Contact(Condition::Topic(topic)) => {
                contact.topics.0.get(topic) == Some(&Subscription::Subscribed)
            }
            Cond::Contact(Condition::Email(email)) => {
                contact
                    .email
                    .as_deref()
                    .map(postmesh_shared::email::key)
                    .as_ref()
                    == Some(email)
            }
            Cond::Contact(Condition::Attribute { name, op, value }) => {
                compare(contact.attributes.0.get(name), *op, value)
            }
            Cond::Contact(Condition::Saved(_)) => false,
        }
    }
}

/// `found op value`; a missing or null `found` only satisfies `neq`.
fn compare(found: Option<&Value>, op: Op, value: &Value) -> bool {
    let found = found.filter(|v| !v.is_null());
    match (op, found) {
        (Op::Exists, f) => f.is_some(),
        (Op::Neq, None) => true,
        (_, None) => false,
        (Op::Eq, Some(f)) => same(f, value),
        (Op::Neq, Some(f)) => !same(f, value),
        (Op::In, Some(f)) => value
            .as_array()
            .is_some_and(|a| a.iter().any(|v| same(f, v))),
        (Op::Gt | Op::Lt, Some(f)) => {
            let order = match (f.as_f64(), value.as_f64()) {
                (Some(a), Some(b)) => a.partial_cmp(&b),
                _ => match (f.as_str(), value.as_str()) {
                    (Some(a), Some(b)) => Some(a.cmp(b)),
                    _ => None,
                },
            };
            order
                == Some(if op == Op::Gt {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Less
                })
        }
    }
}

/// JSON equality, numbers by value (`1` equals `1.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Whether all `conditions` hold.
pub fn all_hold(conditions: &[Cond], contact: &Contact, properties: &Map<String, Value>) -> bool {
    conditions.iter().all(|c| c.holds(contact, properties))
}

fn conditions(raw: &[Value]) -> Result<Vec<Cond>, String> {
    if raw.len() > MAX_CONDITIONS {
        return Err(format!("at most {MAX_CONDITIONS} conditions"));
    }
    raw.iter().map(Cond::parse).collect()
}

impl Rule {
    fn parse(raw: &RuleBody) -> Result<Self, String> {
        Ok(Self {
            event_name: name("event_name", &raw.event_name)?,
            conditions: conditions(&raw.conditions)?,
        })
    }
}

/// Compiles `raw` steps onto the end of `out`.
fn compile(raw: &[Value], depth: usize, out: &mut Vec<Step>) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("branches nest at most {MAX_DEPTH} deep"));
    }
    for step in raw {
        if out.len() >= MAX_STEPS {
            return Err(format!("at most {MAX_STEPS} steps"));
        }
        let obj = step.as_object().ok_or("a step must be an object")?;
        let only = |keys: &[&str]| match obj.keys().find(|k| !keys.contains(&k.as_str())) {
            Some(k) => Err(format!("unknown field {k:?} in a step")),
            None => Ok(()),
        };
        match obj.get("type").and_then(Value::as_str) {
            Some("send") => {
                only(&["type", "templateKey", "emailType", "topic"])?;
                let key = obj
                    .get("templateKey")
                    .and_then(Value::as_str)
                    .ok_or("a send step needs templateKey")?;
                // Lifecycle unless the step says otherwise.
                let email_type = match obj.get("emailType").and_then(Value::as_str) {
                    None | Some("") => Some("lifecycle"),
                    given => given,
                };
                let email_type = EmailType::parse(email_type)
                    .ok_or("emailType must be transactional, lifecycle or marketing")?;
                let topic = match obj.get("topic") {
                    None | Some(Value::Null) => None,
                    Some(t) => Some(name("topic", t.as_str().ok_or("topic must be a string")?)?),
                };
                out.push(Step::Send {
                    template_key: name("templateKey", key)?,
                    email_type,
                    topic,
                });
            }
            Some("wait") => {
                only(&["type", "seconds", "until"])?;
                match (obj.get("seconds"), obj.get("until")) {
                    (Some(s), None) => {
                        let secs = s
                            .as_i64()
                            .filter(|s| (0..=MAX_WAIT_SECS).contains(s))
                            .ok_or(format!(
                                "wait seconds must be a whole number from 0 to {MAX_WAIT_SECS}"
                            ))?;
                        out.push(Step::Wait(secs));
                    }
                    (None, Some(u)) => {
                        let prop = u.as_str().ok_or("wait until must name a property")?;
                        out.push(Step::WaitUntil(name("until", prop)?));
                    }
                    _ => return Err("a wait step needs seconds or until, not both".into()),
                }
            }
            Some("branch") => {
                only(&["type", "condition", "conditions", "then", "else"])?;
                let conds = match (obj.get("condition"), obj.get("conditions")) {
                    (Some(c), None) => vec![Cond::parse(c)?],
                    (None, Some(Value::Array(list))) if !list.is_empty() => conditions(list)?,
                    _ => return Err("a branch needs a condition".into()),
                };
                let list = |key: &str| -> Result<Vec<Value>, String> {
                    match obj.get(key) {
                        None | Some(Value::Null) => Ok(Vec::new()),
                        Some(Value::Array(a)) => Ok(a.clone()),
                        Some(_) => Err(format!("branch {key} must be a list of steps")),
                    }
                };
                let (then, otherwise) = (list("then")?, list("else")?);
                let at = out.len();
                out.push(Step::Jump(0)); // the branch, once its else is placed
                compile(&then, depth + 1, out)?;
                let jump = out.len();
                out.push(Step::Jump(0)); // past the else
                compile(&otherwise, depth + 1, out)?;
                out[at] = Step::Branch {
                    conditions: conds,
                    otherwise: jump + 1,
                };
                out[jump] = Step::Jump(out.len());
            }
            _ => return Err("a step's type must be send, wait or branch".into()),
        }
    }
    Ok(())
}

impl Workflow {
    /// The event names of its exit rules.
    pub fn exit_names(&self) -> Vec<String> {
        self.exits.iter().map(|e| e.event_name.clone()).collect()
    }

    /// Checks and compiles `body`.
    pub fn parse(body: &WorkflowBody) -> Result<Self, String> {
        if body.exit.len() > MAX_EXITS {
            return Err(format!("at most {MAX_EXITS} exit rules"));
        }
        if body.steps.is_empty() {
            return Err("a workflow needs at least one step".into());
        }
        let mut steps = Vec::new();
        compile(&body.steps, 0, &mut steps)?;
        Ok(Self {
            name: name("name", &body.name)?,
            trigger: Rule::parse(&body.trigger)?,
            exits: body
                .exit
                .iter()
                .map(Rule::parse)
                .collect::<Result<_, _>>()?,
            reentry: body.reentry,
            steps,
        })
    }

    /// The templates its send steps use.
    pub fn templates(&self) -> Vec<&str> {
        self.steps
            .iter()
            .filter_map(|s| match s {
                Step::Send { template_key, .. } => Some(template_key.as_str()),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn body(steps: Value) -> WorkflowBody {
        serde_json::from_value(json!({
            "name": "welcome", "trigger": { "event_name": "signed_up" }, "steps": steps
        }))
        .unwrap()
    }

    #[test]
    fn branches_compile_to_jumps() {
        let w = Workflow::parse(&body(json!([
            { "type": "wait", "seconds": 5 },
            { "type": "branch", "condition": { "property": "plan", "value": "pro" },
              "then": [{ "type": "send", "templateKey": "pro" }],
              "else": [{ "type": "send", "templateKey": "free" }, { "type": "wait", "seconds": 1 }] },
            { "type": "send", "templateKey": "bye" }
        ])))
        .unwrap();
        assert_eq!(w.steps.len(), 7);
        assert_eq!(w.steps[0], Step::Wait(5));
        assert!(
            matches!(w.steps[1], Step::Branch { otherwise: 4, .. }),
            "{:?}",
            w.steps[1]
        );
        assert!(matches!(&w.steps[2], Step::Send { template_key, .. } if template_key == "pro"));
        assert_eq!(w.steps[3], Step::Jump(6));
        assert!(matches!(&w.steps[4], Step::Send { template_key, .. } if template_key == "free"));
        assert_eq!(w.steps[5], Step::Wait(1));
        assert!(matches!(&w.steps[6], Step::Send { template_key, .. } if template_key == "bye"));
    }

    #[test]
    fn bad_steps_are_refused() {
        for steps in [
            json!([]),
            json!([{ "type": "sleep" }]),
            json!([{ "type": "wait", "seconds": -1 }]),
            json!([{ "type": "wait", "seconds": 1, "until": "at" }]),
            json!([{ "type": "send" }]),
            json!([{ "type": "send", "templateKey": "a", "emailType": "spam" }]),
            json!([{ "type": "branch", "then": [] }]),
            json!([{ "type": "branch", "condition": { "audienceId": "x" } }]),
        ] {
            assert!(Workflow::parse(&body(steps.clone())).is_err(), "{steps}");
        }
    }

    #[test]
    fn conditions_compare_properties() {
        let props: Map<String, Value> =
            serde_json::from_value(json!({ "n": 3, "plan": "pro", "none": null })).unwrap();
        let holds = |raw: Value| {
            let Cond::Property { name, op, value } = Cond::parse(&raw).unwrap() else {
                panic!("a property condition")
            };
            compare(props.get(&name), op, &value)
        };
        assert!(holds(json!({ "property": "n", "op": "gt", "value": 2 })));
        assert!(!holds(json!({ "property": "n", "op": "lt", "value": 2 })));
        assert!(holds(json!({ "property": "n", "value": 3.0 })));
        assert!(holds(
            json!({ "property": "plan", "op": "in", "value": ["pro", "team"] })
        ));
        assert!(!holds(json!({ "property": "none", "op": "exists" })));
        assert!(holds(
            json!({ "property": "missing", "op": "neq", "value": 1 })
        ));
        assert!(!holds(
            json!({ "property": "missing", "op": "eq", "value": 1 })
        ));
    }
}

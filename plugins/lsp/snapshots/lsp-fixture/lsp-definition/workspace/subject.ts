export const answer = 42
console.log(answer)
